/* The restore's per-record work in C: its own librdkafka consumer, reading changelog records
 * into runs, and the fold's work on the store's entries (entries, forget_reclaimed: below).
 *
 * smoothscale.runtime.changelog defines the record format (parse_record) and the rule that
 * restores a state from it (fold_runs); this module only makes reading it cheap, as CPython's
 * _json does for json. open_consumer(settings) creates a librdkafka consumer (a capsule; the
 * Python side is restore.RestoreConsumer): assign, positions, watermarks, metadata, close.
 * read(consumer, count, timeout) consumes up to `count` messages, reads each record in C from
 * librdkafka's message (no Python object a message), and groups consecutive records of one
 * partition with the same kind, writer and batch into a run:
 *
 *     (topic, partition, kind, writer, batch, offsets, keys, values, supersedes, state_keys)
 *
 * kind: 0 marker, 1 close, 2 data, 3 delete, 4 tombstone (changelog.KIND_CODES); writer: its
 * text, E.S.N (from the key, or a tombstone's header); batch: int or None; then one list entry
 * per record: its offset, key, value (None for a tombstone), the record key it supersedes (or
 * None) and, for a record key of the form d:<state key>@..., that state key (or None).
 *
 * A record it does not read on this fast path (an unusual header, anything parse_record would
 * reject or read in a way of its own) becomes an item of its own, (topic, partition, -1,
 * (offset, key, value, headers), None, ...), headers as confluent-kafka gives them: the caller
 * reads it with parse_record, which says what is wrong. An error becomes (topic or None,
 * partition, -2, (code, text), None, ...). Every record read here is one parse_record reads
 * the same way (tests/runtime/test_changelog_runs.py compares the two).
 *
 * librdkafka's functions are the ones confluent-kafka's extension is linked with, looked up
 * through that extension at import (no headers; one librdkafka in the process). The consumer
 * is the module's own, not confluent-kafka's: confluent-kafka sets an error callback that it
 * serves only inside its own calls, and serving its queue from here aborts the process when a
 * broker goes away. No callback is set here: errors of a partition come back as messages,
 * others are logged by librdkafka.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

enum { MARKER, CLOSE, DATA, DELETE, TOMBSTONE };
#define SLOW (-1)
#define ERROR (-2)
#define ITEM_SIZE 10
#define NO_BATCH (-1)

/* librdkafka's public C API: the types and functions used here (rdkafka.h). */
typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct {
    int err; /* rd_kafka_resp_err_t */
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    void *opaque;
    int err;
    void *_private;
} rd_kafka_topic_partition_t;
typedef struct {
    int cnt;
    int size;
    rd_kafka_topic_partition_t *elems;
} rd_kafka_topic_partition_list_t;

static struct {
    rd_kafka_conf_t *(*conf_new)(void);
    int (*conf_set)(rd_kafka_conf_t *, const char *, const char *, char *, size_t);
    void (*conf_destroy)(rd_kafka_conf_t *);
    rd_kafka_t *(*new_)(int, rd_kafka_conf_t *, char *, size_t);
    int (*poll_set_consumer)(rd_kafka_t *);
    rd_kafka_topic_partition_list_t *(*list_new)(int);
    rd_kafka_topic_partition_t *(*list_add)(rd_kafka_topic_partition_list_t *, const char *,
                                            int32_t);
    void (*list_destroy)(rd_kafka_topic_partition_list_t *);
    rd_kafka_error_t *(*incremental_assign)(rd_kafka_t *, const rd_kafka_topic_partition_list_t *);
    rd_kafka_error_t *(*incremental_unassign)(rd_kafka_t *,
                                              const rd_kafka_topic_partition_list_t *);
    const char *(*error_string)(const rd_kafka_error_t *);
    void (*error_destroy)(rd_kafka_error_t *);
    int (*position)(rd_kafka_t *, rd_kafka_topic_partition_list_t *);
    int (*get_watermark_offsets)(rd_kafka_t *, const char *, int32_t, int64_t *, int64_t *);
    int (*query_watermark_offsets)(rd_kafka_t *, const char *, int32_t, int64_t *, int64_t *,
                                   int);
    int (*metadata)(rd_kafka_t *, int, rd_kafka_topic_t *, const void **, int);
    void (*metadata_destroy)(const void *);
    rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
    void (*topic_destroy)(rd_kafka_topic_t *);
    int (*consumer_close)(rd_kafka_t *);
    void (*destroy)(rd_kafka_t *);
    rd_kafka_queue_t *(*queue_get_consumer)(rd_kafka_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
    void (*message_destroy)(rd_kafka_message_t *);
    const char *(*topic_name)(const rd_kafka_topic_t *);
    int (*message_headers)(const rd_kafka_message_t *, rd_kafka_headers_t **);
    int (*header_get_all)(const rd_kafka_headers_t *, size_t, const char **, const void **,
                          size_t *);
    const char *(*err2str)(int);
} rdk;


/* What one record is, as read on the fast path. The pointers point into the message. */
typedef struct {
    int kind;
    const char *writer; /* the writer's text "E.S.N", in the key or the header */
    Py_ssize_t writer_length;
    long long batch; /* NO_BATCH: none */
    const char *supersedes; /* the record key superseded, or NULL */
    Py_ssize_t supersedes_length;
} Record;

/* The length of an integer at the start of text[0:length] as int() reads it (here: plain
 * digits, with a minus sign if `signed_`, at most `most` of them), or 0 if there is none. */
static Py_ssize_t integer_length(const char *text, Py_ssize_t length, int signed_, int most) {
    Py_ssize_t i = 0;
    if (signed_ && i < length && text[i] == '-') {
        i++;
    }
    Py_ssize_t digits = 0;
    while (i < length && text[i] >= '0' && text[i] <= '9') {
        i++;
        digits++;
    }
    return digits >= 1 && digits <= most ? i : 0;
}

/* The length of a writer "E.S.N" at the start of text[0:length], or 0. */
static Py_ssize_t writer_length(const char *text, Py_ssize_t length) {
    Py_ssize_t i = 0;
    for (int part = 0; part < 3; part++) {
        if (part > 0) {
            if (i >= length || text[i] != '.') {
                return 0;
            }
            i++;
        }
        /* a nonce has up to 19 digits (63 random bits); only Python converts these */
        Py_ssize_t read = integer_length(text + i, length - i, 1, 40);
        if (read == 0) {
            return 0;
        }
        i += read;
    }
    return i;
}

/* Reads the kind, writer and batch from a record's key (m@E.S.N, c@E.S.N.B, d:<key>@E.S.N.B)
 * and whether its value is empty: 1 if read, 0 if the record is for the slow path. */
static int read_key(const char *text, Py_ssize_t length, int empty_value, Record *record) {
    Py_ssize_t at = length - 1;
    while (at >= 0 && text[at] != '@') {
        at--;
    }
    if (length >= 2 && text[0] == 'd' && text[1] == ':' && at >= 2) {
        record->kind = empty_value ? DELETE : DATA;
    } else if (at == 1 && text[0] == 'c') {
        record->kind = CLOSE;
    } else if (at == 1 && text[0] == 'm') {
        record->kind = MARKER;
    } else {
        return 0;
    }
    const char *suffix = text + at + 1;
    Py_ssize_t suffix_length = length - at - 1;
    Py_ssize_t read = writer_length(suffix, suffix_length);
    if (read == 0) {
        return 0;
    }
    record->writer = suffix;
    record->writer_length = read;
    record->batch = NO_BATCH;
    if (record->kind == MARKER) {
        return read == suffix_length;
    }
    if (read >= suffix_length || suffix[read] != '.') {
        return 0;
    }
    const char *batch = suffix + read + 1;
    Py_ssize_t batch_length = suffix_length - read - 1;
    if (integer_length(batch, batch_length, 0, 18) != batch_length) { /* fits a long long */
        return 0;
    }
    record->batch = 0;
    for (Py_ssize_t i = 0; i < batch_length; i++) {
        record->batch = record->batch * 10 + (batch[i] - '0');
    }
    return 1;
}

/* Reads the headers smoothscale writes (the last of a name counts, as in dict(headers)): 1 if
 * read, 0 if the record is for the slow path. */
static int read_headers(const rd_kafka_headers_t *headers, Record *record) {
    const char *name;
    const void *value;
    size_t size;
    int writer_seen = 0;
    const char *writer = NULL, *supersedes = NULL;
    Py_ssize_t writer_size = 0, supersedes_size = 0;
    for (size_t i = 0; headers != NULL && rdk.header_get_all(headers, i, &name, &value, &size) == 0;
         i++) {
        if (strcmp(name, "smoothscale.writer") == 0) {
            writer_seen = 1;
            writer = value;
            writer_size = (Py_ssize_t)size;
        } else if (strcmp(name, "smoothscale.supersedes") == 0) {
            supersedes = value;
            supersedes_size = (Py_ssize_t)size;
        }
    }
    /* parse_record reads no supersedes on a tombstone */
    record->supersedes = record->kind == TOMBSTONE ? NULL : supersedes;
    record->supersedes_length = supersedes_size;
    if (record->kind == TOMBSTONE) {
        if (!writer_seen || writer == NULL) {
            return 0;
        }
        Py_ssize_t read = writer_length(writer, writer_size);
        if (read == 0 || read != writer_size) {
            return 0;
        }
        record->writer = writer;
        record->writer_length = writer_size;
    }
    return 1;
}

/* The state key of a record key d:<state key>@... (a new reference), or None. */
static PyObject *state_key_of(const char *text, Py_ssize_t length) {
    if (length < 2 || text[0] != 'd' || text[1] != ':') {
        Py_RETURN_NONE;
    }
    for (Py_ssize_t at = length - 1; at >= 2; at--) {
        if (text[at] == '@') {
            return PyBytes_FromStringAndSize(text + 2, at - 2);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *bytes_or_none(const void *data, size_t size) {
    if (data == NULL) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize(data, (Py_ssize_t)size);
}

/* An item of `size` fields, the first ones given (new references, any NULL: fails), the rest
 * None. */
static PyObject *new_item(PyObject **fields, int given) {
    PyObject *item = PyTuple_New(ITEM_SIZE);
    int failed = item == NULL;
    for (int i = 0; i < ITEM_SIZE; i++) {
        PyObject *field = i < given ? fields[i] : Py_NewRef(Py_None);
        failed = failed || field == NULL;
        if (item != NULL && field != NULL) {
            PyTuple_SET_ITEM(item, i, field);
        } else {
            Py_XDECREF(field);
        }
    }
    if (failed) {
        Py_XDECREF(item);
        return NULL;
    }
    return item;
}

/* A new run item for its first record (lists empty). */
static PyObject *new_run(PyObject *topic, PyObject *partition, const Record *record) {
    PyObject *fields[ITEM_SIZE] = {
        Py_NewRef(topic),
        Py_NewRef(partition),
        PyLong_FromLong(record->kind),
        PyBytes_FromStringAndSize(record->writer, record->writer_length),
        record->batch == NO_BATCH ? Py_NewRef(Py_None) : PyLong_FromLongLong(record->batch),
    };
    for (int i = 5; i < ITEM_SIZE; i++) {
        fields[i] = PyList_New(0);
    }
    return new_item(fields, ITEM_SIZE);
}

/* The headers of a message as confluent-kafka gives them: None, or a list of (str, bytes or
 * None) pairs. */
static PyObject *headers_of(const rd_kafka_headers_t *headers) {
    if (headers == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *list = PyList_New(0);
    const char *name;
    const void *value;
    size_t size;
    for (size_t i = 0; list != NULL && rdk.header_get_all(headers, i, &name, &value, &size) == 0;
         i++) {
        PyObject *pair = Py_BuildValue("(NN)", PyUnicode_DecodeUTF8(name, strlen(name), "replace"),
                                       bytes_or_none(value, size));
        if (pair == NULL || PyList_Append(list, pair) < 0) {
            Py_XDECREF(pair);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(pair);
    }
    return list;
}

static int append_new(PyObject *list, PyObject *object) {
    if (object == NULL) {
        return -1;
    }
    int result = PyList_Append(list, object);
    Py_DECREF(object);
    return result;
}

/* Whether `run` (an item of this module, or NULL) continues with this record: 1, 0, or -1 on
 * a Python error. */
static int continues(PyObject *run, PyObject *topic, PyObject *partition, const Record *record) {
    if (run == NULL || PyLong_AsLong(PyTuple_GET_ITEM(run, 2)) != record->kind) {
        return 0;
    }
    PyObject *writer = PyTuple_GET_ITEM(run, 3), *batch = PyTuple_GET_ITEM(run, 4);
    if (PyBytes_GET_SIZE(writer) != record->writer_length ||
        memcmp(PyBytes_AS_STRING(writer), record->writer, record->writer_length) != 0) {
        return 0;
    }
    if (batch == Py_None ? record->batch != NO_BATCH
                         : PyLong_AsLongLong(batch) != record->batch) {
        return 0;
    }
    if (PyTuple_GET_ITEM(run, 0) != topic) {
        return 0; /* one str per topic name a read makes (names_by_topic) */
    }
    return PyObject_RichCompareBool(PyTuple_GET_ITEM(run, 1), partition, Py_EQ);
}

/* The topic's name as one str per read (a small cache of librdkafka topic -> str). */
typedef struct {
    const rd_kafka_topic_t *topics[8];
    PyObject *names[8];
    int count;
} Names;

static PyObject *name_of(Names *names, const rd_kafka_topic_t *topic) {
    for (int i = 0; i < names->count; i++) {
        if (names->topics[i] == topic) {
            return names->names[i];
        }
    }
    const char *text = rdk.topic_name(topic);
    PyObject *name = PyUnicode_DecodeUTF8(text, strlen(text), "replace");
    if (name != NULL && names->count < 8) {
        names->topics[names->count] = topic;
        names->names[names->count++] = name;
    } else if (name != NULL) {
        Py_DECREF(names->names[7]);
        names->topics[7] = topic;
        names->names[7] = name;
    }
    return name;
}

/* Reads one message onto `items`. `*run` is the run item the message may continue (borrowed:
 * `items` holds it; NULL: none), and is set to the one the next message may continue.
 * Returns 0, or -1 with an exception set. */
static int read_message(const rd_kafka_message_t *message, PyObject *items, PyObject **run,
                        Names *names) {
    PyObject *topic = message->rkt == NULL ? Py_None : name_of(names, message->rkt);
    if (topic == NULL) {
        return -1;
    }
    PyObject *partition = PyLong_FromLong(message->partition);
    if (partition == NULL) {
        return -1;
    }
    int result = -1;
    if (message->err != 0) {
        *run = NULL;
        const char *text = rdk.err2str(message->err);
        PyObject *fields[4] = {Py_NewRef(topic), Py_NewRef(partition), PyLong_FromLong(ERROR),
                               Py_BuildValue("(is)", message->err, text)};
        result = append_new(items, new_item(fields, 4));
        Py_DECREF(partition);
        return result;
    }
    rd_kafka_headers_t *headers = NULL;
    if (rdk.message_headers(message, &headers) != 0) {
        headers = NULL;
    }
    Record record = {0, NULL, 0, NO_BATCH, NULL, 0};
    const char *key = message->key;
    Py_ssize_t key_length = (Py_ssize_t)message->key_len;
    int fast = 0;
    if (key != NULL) {
        if (message->payload == NULL) {
            record.kind = TOMBSTONE;
            fast = 1;
        } else {
            fast = read_key(key, key_length, message->len == 0, &record);
        }
        fast = fast && read_headers(headers, &record);
    }
    if (!fast) {
        *run = NULL;
        PyObject *fields[4] = {
            Py_NewRef(topic), Py_NewRef(partition), PyLong_FromLong(SLOW),
            Py_BuildValue("(LNNN)", (long long)message->offset, bytes_or_none(key, key_length),
                          bytes_or_none(message->payload, message->len), headers_of(headers)),
        };
        result = append_new(items, new_item(fields, 4));
        Py_DECREF(partition);
        return result;
    }
    int continued = continues(*run, topic, partition, &record);
    if (continued < 0) {
        goto done;
    }
    if (!continued) {
        PyObject *started = new_run(topic, partition, &record);
        if (append_new(items, started) < 0) {
            *run = NULL;
            goto done;
        }
        *run = started; /* `items` holds it */
    }
    if (append_new(PyTuple_GET_ITEM(*run, 5), PyLong_FromLongLong(message->offset)) < 0 ||
        append_new(PyTuple_GET_ITEM(*run, 6), PyBytes_FromStringAndSize(key, key_length)) < 0 ||
        append_new(PyTuple_GET_ITEM(*run, 7),
                   record.kind == TOMBSTONE ? Py_NewRef(Py_None)
                                            : bytes_or_none(message->payload, message->len)) < 0 ||
        append_new(PyTuple_GET_ITEM(*run, 8),
                   bytes_or_none(record.supersedes, record.supersedes_length)) < 0 ||
        append_new(PyTuple_GET_ITEM(*run, 9),
                   record.kind == MARKER || record.kind == CLOSE ? Py_NewRef(Py_None)
                                                                : state_key_of(key, key_length)) < 0) {
        goto done;
    }
    result = 0;
done:
    Py_DECREF(partition);
    return result;
}

/* The restore's own librdkafka consumer: a capsule holding its handle (NULL once closed). */
#define CAPSULE "smoothscale.restore-consumer"

static void capsule_destroy(PyObject *capsule) {
    rd_kafka_t **rk = PyCapsule_GetPointer(capsule, CAPSULE);
    if (rk != NULL && *rk != NULL) {
        rdk.destroy(*rk);
    }
    PyMem_Free(rk);
}

static rd_kafka_t *handle_of(PyObject *consumer) {
    if (!PyCapsule_IsValid(consumer, CAPSULE)) {
        PyErr_SetString(PyExc_TypeError, "not the restore's consumer (_changelog.open_consumer)");
        return NULL;
    }
    rd_kafka_t **rk = PyCapsule_GetPointer(consumer, CAPSULE);
    if (rk == NULL) {
        return NULL;
    }
    if (*rk == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the consumer is closed");
        return NULL;
    }
    return *rk;
}

static PyObject *open_consumer(PyObject *module, PyObject *config) {
    (void)module;
    if (!PyDict_Check(config)) {
        PyErr_SetString(PyExc_TypeError, "open_consumer() takes a dict of str settings");
        return NULL;
    }
    char error[512];
    rd_kafka_conf_t *conf = rdk.conf_new();
    PyObject *key, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(config, &at, &key, &value)) {
        const char *name = PyUnicode_AsUTF8(key), *text = PyUnicode_AsUTF8(value);
        if (name == NULL || text == NULL) {
            rdk.conf_destroy(conf);
            return NULL;
        }
        if (rdk.conf_set(conf, name, text, error, sizeof(error)) != 0) {
            rdk.conf_destroy(conf);
            PyErr_Format(PyExc_ValueError, "%s", error);
            return NULL;
        }
    }
    rd_kafka_t *rk = rdk.new_(1 /* RD_KAFKA_CONSUMER */, conf, error, sizeof(error));
    if (rk == NULL) {
        rdk.conf_destroy(conf);
        PyErr_Format(PyExc_ValueError, "%s", error);
        return NULL;
    }
    rdk.poll_set_consumer(rk);
    rd_kafka_t **held = PyMem_Malloc(sizeof(*held));
    if (held == NULL) {
        rdk.destroy(rk);
        return PyErr_NoMemory();
    }
    *held = rk;
    PyObject *capsule = PyCapsule_New(held, CAPSULE, capsule_destroy);
    if (capsule == NULL) {
        rdk.destroy(rk);
        PyMem_Free(held);
    }
    return capsule;
}

/* A partition list from a list of (topic, partition, offset) tuples. */
static rd_kafka_topic_partition_list_t *partitions_of(PyObject *list) {
    if (!PyList_Check(list)) {
        PyErr_SetString(PyExc_TypeError, "a list of (topic, partition, offset)");
        return NULL;
    }
    rd_kafka_topic_partition_list_t *partitions = rdk.list_new((int)PyList_GET_SIZE(list));
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        const char *topic;
        int partition;
        long long offset;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "siL", &topic, &partition, &offset)) {
            rdk.list_destroy(partitions);
            return NULL;
        }
        rdk.list_add(partitions, topic, partition)->offset = offset;
    }
    return partitions;
}

static PyObject *assign(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer, *list;
    int add;
    if (!PyArg_ParseTuple(args, "OOp:assign", &consumer, &list, &add)) {
        return NULL;
    }
    rd_kafka_t *rk = handle_of(consumer);
    rd_kafka_topic_partition_list_t *partitions = rk == NULL ? NULL : partitions_of(list);
    if (partitions == NULL) {
        return NULL;
    }
    rd_kafka_error_t *error = add ? rdk.incremental_assign(rk, partitions)
                                  : rdk.incremental_unassign(rk, partitions);
    rdk.list_destroy(partitions);
    if (error != NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s", rdk.error_string(error));
        rdk.error_destroy(error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *positions(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer, *list;
    if (!PyArg_ParseTuple(args, "OO:positions", &consumer, &list)) {
        return NULL;
    }
    rd_kafka_t *rk = handle_of(consumer);
    rd_kafka_topic_partition_list_t *partitions = rk == NULL ? NULL : partitions_of(list);
    if (partitions == NULL) {
        return NULL;
    }
    rdk.position(rk, partitions);
    PyObject *found = PyList_New(partitions->cnt);
    for (int i = 0; found != NULL && i < partitions->cnt; i++) {
        PyObject *offset = PyLong_FromLongLong(partitions->elems[i].offset);
        if (offset == NULL) {
            Py_CLEAR(found);
            break;
        }
        PyList_SET_ITEM(found, i, offset);
    }
    rdk.list_destroy(partitions);
    return found;
}

/* A timeout in seconds as librdkafka takes it: milliseconds, -1 for none. */
static int milliseconds(double timeout) {
    return timeout < 0 ? -1 : (int)(timeout * 1000);
}

static PyObject *cached_watermarks(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer;
    const char *topic;
    int partition;
    if (!PyArg_ParseTuple(args, "Osi:cached_watermarks", &consumer, &topic, &partition)) {
        return NULL;
    }
    rd_kafka_t *rk = handle_of(consumer);
    if (rk == NULL) {
        return NULL;
    }
    int64_t low = -1001, high = -1001;
    rdk.get_watermark_offsets(rk, topic, partition, &low, &high);
    return Py_BuildValue("(LL)", (long long)low, (long long)high);
}

static PyObject *query_watermarks(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer;
    const char *topic;
    int partition;
    double timeout;
    if (!PyArg_ParseTuple(args, "Osid:query_watermarks", &consumer, &topic, &partition, &timeout)) {
        return NULL;
    }
    rd_kafka_t *rk = handle_of(consumer);
    if (rk == NULL) {
        return NULL;
    }
    int64_t low = -1001, high = -1001;
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = rdk.query_watermark_offsets(rk, topic, partition, &low, &high, milliseconds(timeout));
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(iLL)", error, (long long)low, (long long)high);
}

static PyObject *refresh_metadata(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer;
    const char *topic;
    double timeout;
    if (!PyArg_ParseTuple(args, "Osd:refresh_metadata", &consumer, &topic, &timeout)) {
        return NULL;
    }
    rd_kafka_t *rk = handle_of(consumer);
    if (rk == NULL) {
        return NULL;
    }
    rd_kafka_topic_t *handle = rdk.topic_new(rk, topic, NULL);
    if (handle == NULL) {
        PyErr_Format(PyExc_RuntimeError, "librdkafka has no handle for topic %s", topic);
        return NULL;
    }
    const void *metadata = NULL;
    int error;
    Py_BEGIN_ALLOW_THREADS
    error = rdk.metadata(rk, 0, handle, &metadata, milliseconds(timeout));
    Py_END_ALLOW_THREADS
    if (metadata != NULL) {
        rdk.metadata_destroy(metadata);
    }
    rdk.topic_destroy(handle);
    return PyLong_FromLong(error);
}

static PyObject *close_consumer(PyObject *module, PyObject *consumer) {
    (void)module;
    rd_kafka_t **rk = PyCapsule_GetPointer(consumer, CAPSULE);
    if (rk == NULL) {
        return NULL;
    }
    if (*rk != NULL) {
        rd_kafka_t *closing = *rk;
        *rk = NULL;
        Py_BEGIN_ALLOW_THREADS
        rdk.consumer_close(closing);
        rdk.destroy(closing);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *read_runs(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer;
    Py_ssize_t count;
    double timeout;
    if (!PyArg_ParseTuple(args, "Ond:read", &consumer, &count, &timeout)) {
        return NULL;
    }
    if (count < 1) {
        PyErr_SetString(PyExc_ValueError, "read() reads at least one message");
        return NULL;
    }
    rd_kafka_t *rk = handle_of(consumer);
    if (rk == NULL) {
        return NULL;
    }
    rd_kafka_message_t **messages = PyMem_Malloc(sizeof(*messages) * (size_t)count);
    if (messages == NULL) {
        return PyErr_NoMemory();
    }
    rd_kafka_queue_t *queue = rdk.queue_get_consumer(rk);
    ssize_t consumed = -1;
    if (queue != NULL) {
        int timeout_ms = milliseconds(timeout);
        Py_BEGIN_ALLOW_THREADS
        consumed = rdk.consume_batch_queue(queue, timeout_ms, messages, (size_t)count);
        Py_END_ALLOW_THREADS
        rdk.queue_destroy(queue);
    }
    if (consumed < 0) {
        PyMem_Free(messages);
        PyErr_SetString(PyExc_RuntimeError, "librdkafka could not consume (no consumer queue)");
        return NULL;
    }
    PyObject *items = PyList_New(0), *run = NULL;
    Names names = {.count = 0};
    for (ssize_t i = 0; i < consumed; i++) {
        if (items != NULL && read_message(messages[i], items, &run, &names) < 0) {
            Py_CLEAR(items);
        }
        rdk.message_destroy(messages[i]);
    }
    for (int i = 0; i < names.count; i++) {
        Py_DECREF(names.names[i]);
    }
    PyMem_Free(messages);
    if (items == NULL) {
        return NULL;
    }
    return Py_BuildValue("(nN)", (Py_ssize_t)consumed, items);
}

/* The fold's per-record work on the store's entries (smoothscale.runtime.store.entry defines
 * them): a record key's length (4 bytes, big-endian; the top bit set for a delete), the record
 * key, and the value. */
#define DELETED 0x80000000u

static PyObject *entry_of(PyObject *record_key, PyObject *value) {
    if (!PyBytes_Check(record_key) || (value != Py_None && !PyBytes_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "an entry's record key and value are bytes");
        return NULL;
    }
    Py_ssize_t key_length = PyBytes_GET_SIZE(record_key);
    Py_ssize_t value_length = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
    if (key_length >= (Py_ssize_t)DELETED) {
        PyErr_SetString(PyExc_ValueError, "a record key of 2 GiB or more");
        return NULL;
    }
    PyObject *made = PyBytes_FromStringAndSize(NULL, 4 + key_length + value_length);
    if (made == NULL) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(made);
    uint32_t head = (uint32_t)key_length | (value == Py_None ? DELETED : 0);
    out[0] = (unsigned char)(head >> 24);
    out[1] = (unsigned char)(head >> 16);
    out[2] = (unsigned char)(head >> 8);
    out[3] = (unsigned char)head;
    memcpy(out + 4, PyBytes_AS_STRING(record_key), (size_t)key_length);
    if (value_length > 0) {
        memcpy(out + 4 + key_length, PyBytes_AS_STRING(value), (size_t)value_length);
    }
    return made;
}

static PyObject *entries(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *keys, *values;
    if (!PyArg_ParseTuple(args, "O!O:entries", &PyList_Type, &keys, &values)) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys);
    if (values != Py_None && (!PyList_Check(values) || PyList_GET_SIZE(values) != count)) {
        PyErr_SetString(PyExc_TypeError, "entries() takes a list of values as long as the keys");
        return NULL;
    }
    PyObject *made = PyList_New(count);
    for (Py_ssize_t i = 0; made != NULL && i < count; i++) {
        PyObject *value = values == Py_None ? Py_None : PyList_GET_ITEM(values, i);
        PyObject *entry = entry_of(PyList_GET_ITEM(keys, i), value);
        if (entry == NULL) {
            Py_CLEAR(made);
        } else {
            PyList_SET_ITEM(made, i, entry);
        }
    }
    return made;
}

/* Whether `entry` (bytes) is one of the record `record_key` (bytes). */
static int entry_is_of(PyObject *entry, PyObject *record_key) {
    Py_ssize_t size = PyBytes_GET_SIZE(entry), key_length = PyBytes_GET_SIZE(record_key);
    if (size < 4) {
        return 0;
    }
    const unsigned char *in = (const unsigned char *)PyBytes_AS_STRING(entry);
    uint32_t head = ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) |
                    (uint32_t)in[3];
    Py_ssize_t length = (Py_ssize_t)(head & ~DELETED);
    return length == key_length && size >= 4 + length &&
           memcmp(in + 4, PyBytes_AS_STRING(record_key), (size_t)length) == 0;
}

static PyObject *forget_reclaimed(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *changed, *keys, *state_keys;
    if (!PyArg_ParseTuple(args, "O!O!O!:forget_reclaimed", &PyDict_Type, &changed, &PyList_Type,
                          &keys, &PyList_Type, &state_keys)) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(state_keys) != count) {
        PyErr_SetString(PyExc_ValueError, "forget_reclaimed() takes a state key per record key");
        return NULL;
    }
    PyObject *elsewhere = PyList_New(0);
    for (Py_ssize_t i = 0; elsewhere != NULL && i < count; i++) {
        PyObject *state_key = PyList_GET_ITEM(state_keys, i);
        if (state_key == Py_None) {
            continue;
        }
        PyObject *current = PyDict_GetItemWithError(changed, state_key); /* borrowed */
        if (current == NULL) {
            if (PyErr_Occurred() || append_new(elsewhere, PyLong_FromSsize_t(i)) < 0) {
                Py_CLEAR(elsewhere);
            }
            continue;
        }
        PyObject *record_key = PyList_GET_ITEM(keys, i);
        if (current == Py_None) {
            continue;
        }
        if (!PyBytes_Check(current) || !PyBytes_Check(record_key)) {
            PyErr_SetString(PyExc_TypeError, "entries and record keys are bytes");
            Py_CLEAR(elsewhere);
        } else if (entry_is_of(current, record_key) &&
                   PyDict_SetItem(changed, state_key, Py_None) < 0) {
            Py_CLEAR(elsewhere);
        }
    }
    return elsewhere;
}

static PyMethodDef methods[] = {
    {"open_consumer", open_consumer, METH_O, "open_consumer(settings) -> the restore's consumer"},
    {"assign", assign, METH_VARARGS, "assign(consumer, [(topic, partition, offset)], add)"},
    {"positions", positions, METH_VARARGS, "positions(consumer, [(topic, partition, 0)])"},
    {"cached_watermarks", cached_watermarks, METH_VARARGS,
     "cached_watermarks(consumer, topic, partition) -> (low, high)"},
    {"query_watermarks", query_watermarks, METH_VARARGS,
     "query_watermarks(consumer, topic, partition, timeout) -> (error code, low, high)"},
    {"refresh_metadata", refresh_metadata, METH_VARARGS,
     "refresh_metadata(consumer, topic, timeout) -> error code"},
    {"close", close_consumer, METH_O, "close(consumer)"},
    {"read", read_runs, METH_VARARGS,
     "read(consumer, count, timeout) -> (messages consumed, items): consume up to `count` "
     "changelog messages, waiting at most `timeout` seconds, and read them into runs (see the "
     "module's documentation)."},
    {"entries", entries, METH_VARARGS,
     "entries(record_keys, values) -> the store's entries of these records (values None: of "
     "deletes), as smoothscale.runtime.store.entry makes them."},
    {"forget_reclaimed", forget_reclaimed, METH_VARARGS,
     "forget_reclaimed(entries, record_keys, state_keys) -> indexes: the tombstones of "
     "record_keys (each of state_keys, None for no state key) set to None the keys of `entries` "
     "(state key -> entry or None) whose entry is still that record; returns the indexes of "
     "the records whose state key `entries` does not hold."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_changelog",
    "The restore's per-record work in C: consuming changelog records, splitting them into "
    "runs, and making and reclaiming the store's entries.",
    -1, methods, NULL, NULL, NULL, NULL,
};

/* librdkafka's functions, from the library confluent-kafka's extension `path` is linked with
 * (dlsym through a handle searches the object and what it depends on). */
static int load_librdkafka(const char *path) {
    void *library = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (library == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot find confluent-kafka's librdkafka: %s", dlerror());
        return -1;
    }
    struct {
        void **function;
        const char *name;
    } wanted[] = {
        {(void **)&rdk.conf_new, "rd_kafka_conf_new"},
        {(void **)&rdk.conf_set, "rd_kafka_conf_set"},
        {(void **)&rdk.conf_destroy, "rd_kafka_conf_destroy"},
        {(void **)&rdk.new_, "rd_kafka_new"},
        {(void **)&rdk.poll_set_consumer, "rd_kafka_poll_set_consumer"},
        {(void **)&rdk.list_new, "rd_kafka_topic_partition_list_new"},
        {(void **)&rdk.list_add, "rd_kafka_topic_partition_list_add"},
        {(void **)&rdk.list_destroy, "rd_kafka_topic_partition_list_destroy"},
        {(void **)&rdk.incremental_assign, "rd_kafka_incremental_assign"},
        {(void **)&rdk.incremental_unassign, "rd_kafka_incremental_unassign"},
        {(void **)&rdk.error_string, "rd_kafka_error_string"},
        {(void **)&rdk.error_destroy, "rd_kafka_error_destroy"},
        {(void **)&rdk.position, "rd_kafka_position"},
        {(void **)&rdk.get_watermark_offsets, "rd_kafka_get_watermark_offsets"},
        {(void **)&rdk.query_watermark_offsets, "rd_kafka_query_watermark_offsets"},
        {(void **)&rdk.metadata, "rd_kafka_metadata"},
        {(void **)&rdk.metadata_destroy, "rd_kafka_metadata_destroy"},
        {(void **)&rdk.topic_new, "rd_kafka_topic_new"},
        {(void **)&rdk.topic_destroy, "rd_kafka_topic_destroy"},
        {(void **)&rdk.consumer_close, "rd_kafka_consumer_close"},
        {(void **)&rdk.destroy, "rd_kafka_destroy"},
        {(void **)&rdk.queue_get_consumer, "rd_kafka_queue_get_consumer"},
        {(void **)&rdk.queue_destroy, "rd_kafka_queue_destroy"},
        {(void **)&rdk.consume_batch_queue, "rd_kafka_consume_batch_queue"},
        {(void **)&rdk.message_destroy, "rd_kafka_message_destroy"},
        {(void **)&rdk.topic_name, "rd_kafka_topic_name"},
        {(void **)&rdk.message_headers, "rd_kafka_message_headers"},
        {(void **)&rdk.header_get_all, "rd_kafka_header_get_all"},
        {(void **)&rdk.err2str, "rd_kafka_err2str"},
    };
    for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        *wanted[i].function = dlsym(library, wanted[i].name);
        if (*wanted[i].function == NULL) {
            PyErr_Format(PyExc_ImportError, "confluent-kafka's librdkafka has no %s",
                         wanted[i].name);
            return -1;
        }
    }
    return 0; /* the library stays loaded: confluent-kafka holds it */
}

PyMODINIT_FUNC PyInit__changelog(void) {
    PyObject *cimpl = PyImport_ImportModule("confluent_kafka.cimpl");
    if (cimpl == NULL) {
        return NULL;
    }
    PyObject *path = PyObject_GetAttrString(cimpl, "__file__");
    Py_DECREF(cimpl);
    if (path == NULL) {
        return NULL;
    }
    int failed = !PyUnicode_Check(path) || load_librdkafka(PyUnicode_AsUTF8(path)) < 0;
    Py_DECREF(path);
    if (failed) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ImportError, "confluent_kafka.cimpl has no file path");
        }
        return NULL;
    }
    return PyModule_Create(&module);
}
