/* The restore's per-record work in C: its own librdkafka consumer, and the fold of changelog
 * records into the changes to write to a task's store.
 *
 * smoothscale.runtime.changelog defines the record format (parse_record) and the rule that
 * restores a state from it (its module documentation); this module only makes applying it cheap,
 * as CPython's _json does for json. open_consumer(settings) creates a librdkafka consumer (a
 * capsule; the Python side is restore.RestoreConsumer): assign, positions, watermarks, metadata,
 * close. A Fold is the fold of one changelog partition: where it stands (the highest writer
 * seen, W*, the batch W* last closed, W*'s batch not closed yet) and the changes folded since
 * they were last taken (take(): per state key its new entry, the garbage set's additions and
 * removals, the closers' values). read(consumer, count, timeout, folds, slow) consumes up to
 * `count` messages and folds each record into its partition's Fold straight from librdkafka's
 * message: the Python objects a record makes are those the changes keep (its state key and
 * entry, the record key it supersedes), or those a tombstone needs to look its record up. A
 * record superseded before the changes are taken leaves nothing behind.
 *
 * A record it does not read on this fast path (an unusual header, anything parse_record would
 * reject or read in a way of its own, a writer beyond 64-bit numbers) goes to the `slow`
 * callback with its message (offset, key, value, headers as confluent-kafka gives them), which
 * reads it with parse_record and folds it (Fold.add), or fails the partition's task. An error
 * event comes back as (topic or None, partition, code, text). Every record read here is one
 * parse_record reads the same way (tests/runtime/test_changelog_runs.py compares the two).
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
    void (*queue_yield)(rd_kafka_queue_t *);
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

/* The writer of the last record read, parsed: most records of a changelog are one writer's,
 * and parsing its text for every record was about a twentieth of a restore's time. */
typedef struct {
    Py_ssize_t length; /* 0: none yet */
    char text[64];
    long long numbers[3];
} LastWriter;

/* writer_length, knowing `last`'s writer without reading its digits again (NULL: none). */
static Py_ssize_t known_writer_length(const LastWriter *last, const char *text,
                                      Py_ssize_t length) {
    if (last != NULL && last->length > 0 && length >= last->length &&
        memcmp(text, last->text, (size_t)last->length) == 0 &&
        (length == last->length || text[last->length] == '.')) {
        return last->length;
    }
    return writer_length(text, length);
}

/* Reads the kind, writer and batch from a record's key (m@E.S.N, c@E.S.N.B, d:<key>@E.S.N.B)
 * and whether its value is empty: 1 if read, 0 if the record is for the slow path. */
static int read_key(const char *text, Py_ssize_t length, int empty_value, Record *record,
                    const LastWriter *last) {
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
    Py_ssize_t read = known_writer_length(last, suffix, suffix_length);
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
static int read_headers(const rd_kafka_headers_t *headers, Record *record,
                        const LastWriter *last) {
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
        Py_ssize_t read = known_writer_length(last, writer, writer_size);
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

/* A writer "E.S.N" (text[0:length], as writer_length reads it) as three numbers: 1, or 0 if
 * one does not fit a long long (then the record goes to the slow path, whose fold refuses it). */
static int writer_numbers(const char *text, Py_ssize_t length, long long numbers[3]) {
    Py_ssize_t i = 0;
    for (int part = 0; part < 3; part++) {
        if (part > 0) {
            i++; /* the '.' writer_length found */
        }
        int negative = i < length && text[i] == '-';
        i += negative;
        unsigned long long value = 0;
        for (; i < length && text[i] >= '0' && text[i] <= '9'; i++) {
            unsigned long long digit = (unsigned long long)(text[i] - '0');
            if (value > (9223372036854775808ull - digit) / 10) {
                return 0;
            }
            value = value * 10 + digit;
        }
        if (value > 9223372036854775807ull + (unsigned long long)negative) {
            return 0;
        }
        numbers[part] = negative ? (long long)(0 - value) : (long long)value;
    }
    return 1;
}

/* writer_numbers, kept in `last` for the records after. */
static int known_writer_numbers(LastWriter *last, const char *text, Py_ssize_t length,
                                long long numbers[3]) {
    if (length != last->length || memcmp(text, last->text, (size_t)length) != 0) {
        if (!writer_numbers(text, length, last->numbers)) {
            last->length = 0;
            return 0;
        }
        last->length = length <= (Py_ssize_t)sizeof(last->text) ? length : 0;
        memcpy(last->text, text, (size_t)last->length);
    }
    memcpy(numbers, last->numbers, sizeof(last->numbers));
    return 1;
}

/* The store's entries (smoothscale.runtime.store.entry defines them): a record key's length
 * (4 bytes, big-endian; the top bit set for a delete), the record key, and the value. */
#define DELETED 0x80000000u

/* The entry of the record `key` with `value` (NULL: a delete), a new reference. */
static PyObject *entry_of(const char *key, Py_ssize_t key_length, const char *value,
                          Py_ssize_t value_length) {
    if (key_length >= (Py_ssize_t)DELETED) {
        PyErr_SetString(PyExc_ValueError, "a record key of 2 GiB or more");
        return NULL;
    }
    PyObject *made = PyBytes_FromStringAndSize(NULL, 4 + key_length + value_length);
    if (made == NULL) {
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(made);
    uint32_t head = (uint32_t)key_length | (value == NULL ? DELETED : 0);
    out[0] = (unsigned char)(head >> 24);
    out[1] = (unsigned char)(head >> 16);
    out[2] = (unsigned char)(head >> 8);
    out[3] = (unsigned char)head;
    memcpy(out + 4, key, (size_t)key_length);
    if (value_length > 0) {
        memcpy(out + 4 + key_length, value, (size_t)value_length);
    }
    return made;
}

/* Whether `entry` (bytes) is one of the record `key`. */
static int entry_is_of(PyObject *entry, const char *key, Py_ssize_t key_length) {
    Py_ssize_t size = PyBytes_GET_SIZE(entry);
    if (size < 4) {
        return 0;
    }
    const unsigned char *in = (const unsigned char *)PyBytes_AS_STRING(entry);
    uint32_t head = ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) |
                    (uint32_t)in[3];
    Py_ssize_t length = (Py_ssize_t)(head & ~DELETED);
    return length == key_length && size >= 4 + length &&
           memcmp(in + 4, key, (size_t)length) == 0;
}

/* The tombstones of the batch path (store.StateChanges.reclaim) on changes it built. */
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
        } else if (entry_is_of(current, PyBytes_AS_STRING(record_key),
                               PyBytes_GET_SIZE(record_key)) &&
                   PyDict_SetItem(changed, state_key, Py_None) < 0) {
            Py_CLEAR(elsewhere);
        }
    }
    return elsewhere;
}

/* The fold of one changelog partition (smoothscale.runtime.changelog documents the rule). */

/* A record of W*'s open batch (a data or delete record): what it makes once the batch closes. */
typedef struct {
    long long offset;
    PyObject *state_key; /* bytes */
    PyObject *entry;     /* bytes: the store's entry it makes */
    char *supersedes;    /* the record key it supersedes (PyMem), or NULL */
    Py_ssize_t supersedes_length;
} Pending;

/* The garbage set's additions and removals as one table of record keys, each in the garbage
 * set (superseded) or out of it (collected: tombstoned); a key superseded and then tombstoned
 * in the same changes leaves the table. In C rather than two Python sets: a restore supersedes
 * and tombstones most records it reads, and a Python object for each record key, hashed into a
 * set and out again, was about a quarter of the fold's time (measured, 2026-11-28). Open
 * addressing, linear probing; a slot whose key left is GONE until the table is rebuilt. A byte
 * a slot beside them (its tag: EMPTY, GONE, or seven bits of its key's hash) is what a probe
 * reads: the slots, a cache line each, are read only where a tag matches. (Probing the slots
 * themselves was a seventh of a restore's time: a table of 16,384 slots a changelog partition
 * misses the cache.) */
enum { SLOT_EMPTY = 0, SLOT_GONE, SLOT_GARBAGE, SLOT_COLLECTED };
#define INLINE_KEY 48
/* A slot is one cache line: a key of up to INLINE_KEY bytes (a record key of a state key of up
 * to about 8 bytes) is compared where its hash is, without an allocation of its own. */
typedef struct {
    uint64_t hash;
    uint32_t length;
    int32_t state;
    union {
        char *heap; /* a longer key (PyMem), while GARBAGE or COLLECTED */
        char bytes[INLINE_KEY];
    } key;
} KeySlot;

static const char *slot_key(const KeySlot *slot) {
    return slot->length > INLINE_KEY ? slot->key.heap : slot->key.bytes;
}

static void slot_free_key(KeySlot *slot) {
    if (slot->length > INLINE_KEY &&
        (slot->state == SLOT_GARBAGE || slot->state == SLOT_COLLECTED)) {
        PyMem_Free(slot->key.heap);
    }
}

enum { TAG_EMPTY = 0, TAG_GONE = 1 };

static uint8_t key_tag(uint64_t hash) {
    return (uint8_t)(0x80 | (hash >> 57)); /* the index takes the low bits */
}

typedef struct {
    KeySlot *slots;
    uint8_t *tags;   /* a slot's tag: TAG_EMPTY, TAG_GONE, or key_tag of its key */
    size_t capacity; /* 0 or a power of 2 */
    size_t filled;   /* slots not EMPTY */
    Py_ssize_t garbage, collected;
} KeyTable;

typedef struct {
    PyObject_HEAD
    int has_writer;
    long long writer[3]; /* W*: epoch, session, nonce */
    long long closed;    /* the batch W* last closed, -1: none */
    long long pending_batch;     /* the open batch (its first record's) */
    long long pending_low, pending_high; /* the lowest and highest batch of its records */
    Pending *pending;
    Py_ssize_t pending_count, pending_capacity;
    long long read_to; /* the changelog offset after the last record read */
    /* The changes not yet taken (store.StateChanges, for this store): */
    PyObject *entries;   /* dict: state key -> entry, or None to forget the key */
    PyObject *reclaimed; /* dict: state key -> set of record keys tombstoned */
    KeyTable keys;       /* record keys superseded (garbage) or tombstoned (collected) */
    PyObject *closers;   /* list: the values of the closers applied, in order */
    int changed;         /* anything to write since the last take */
    /* About how much memory the changes and the open batch hold (`kept`): */
    Py_ssize_t held_changes, held_pending;
    long long applied, skipped;
} Fold;

/* About the memory a bytes object the fold keeps takes (its bytes, its header, and the slot of
 * the container that holds it), counted against restore.WRITE_BEHIND_BYTES: what the fold
 * holds, not what it has read (a key updated a hundred times holds one entry). */
static Py_ssize_t kept_bytes(Py_ssize_t length) {
    return length + 100;
}

static Py_ssize_t kept(PyObject *bytes) {
    return kept_bytes(PyBytes_GET_SIZE(bytes));
}

static Py_ssize_t pending_kept(const Pending *record) {
    return kept(record->state_key) + kept(record->entry) +
           (record->supersedes == NULL ? 0 : kept_bytes(record->supersedes_length));
}

static uint64_t key_hash(const char *key, Py_ssize_t length) {
    /* eight bytes a step (a record key is about 40), then a 64-bit finalizer */
    uint64_t hash = 14695981039346656037ull ^ (uint64_t)length;
    Py_ssize_t i = 0;
    for (; i + 8 <= length; i += 8) {
        uint64_t word;
        memcpy(&word, key + i, 8);
        hash = (hash ^ word) * 0x9e3779b97f4a7c15ull;
        hash ^= hash >> 29;
    }
    if (i < length) {
        uint64_t word = 0;
        memcpy(&word, key + i, (size_t)(length - i));
        hash = (hash ^ word) * 0x9e3779b97f4a7c15ull;
    }
    hash ^= hash >> 33;
    hash *= 0xff51afd7ed558ccdull;
    return hash ^ (hash >> 33);
}

/* The slot holding `key`, or the one it would take (the first GONE slot on its probe, else
 * the EMPTY slot that ends it). The table has a slot and at least one EMPTY slot. */
static KeySlot *key_slot(KeyTable *table, const char *key, Py_ssize_t length, uint64_t hash) {
    size_t mask = table->capacity - 1;
    uint8_t tag = key_tag(hash);
    KeySlot *free_slot = NULL;
    for (size_t i = (size_t)hash & mask;; i = (i + 1) & mask) {
        uint8_t seen = table->tags[i];
        if (seen == TAG_EMPTY) {
            return free_slot != NULL ? free_slot : &table->slots[i];
        }
        if (seen == TAG_GONE) {
            free_slot = free_slot != NULL ? free_slot : &table->slots[i];
        } else if (seen == tag) {
            KeySlot *slot = &table->slots[i];
            if (slot->hash == hash && slot->length == (uint32_t)length &&
                memcmp(slot_key(slot), key, (size_t)length) == 0) {
                return slot;
            }
        }
    }
}

static void key_table_clear(KeyTable *table) {
    for (size_t i = 0; i < table->capacity; i++) {
        slot_free_key(&table->slots[i]);
    }
    PyMem_Free(table->slots);
    PyMem_Free(table->tags);
    *table = (KeyTable){NULL, NULL, 0, 0, 0, 0};
}

/* Room for one more key: at most half the slots taken (GONE ones dropped when rebuilt). */
static int key_table_reserve(KeyTable *table) {
    if (2 * (table->filled + 1) <= table->capacity) {
        return 0;
    }
    size_t live = (size_t)(table->garbage + table->collected);
    size_t capacity = 64;
    while (capacity < 4 * (live + 1)) {
        capacity *= 2;
    }
    KeySlot *slots = PyMem_Calloc(capacity, sizeof(KeySlot));
    uint8_t *tags = PyMem_Calloc(capacity, 1);
    if (slots == NULL || tags == NULL) {
        PyMem_Free(slots);
        PyMem_Free(tags);
        PyErr_NoMemory();
        return -1;
    }
    KeyTable grown = {slots, tags, capacity, 0, table->garbage, table->collected};
    for (size_t i = 0; i < table->capacity; i++) {
        KeySlot *slot = &table->slots[i];
        if (slot->state == SLOT_GARBAGE || slot->state == SLOT_COLLECTED) {
            KeySlot *moved = key_slot(&grown, slot_key(slot), slot->length, slot->hash);
            *moved = *slot;
            tags[moved - slots] = key_tag(slot->hash);
            grown.filled++;
        }
    }
    PyMem_Free(table->slots);
    PyMem_Free(table->tags);
    *table = grown;
    return 0;
}

/* Sets `key`'s state to GARBAGE or COLLECTED (from `from`, which it had: EMPTY/GONE for a
 * key not in the table). Returns the slot, or NULL with an exception. */
static KeySlot *key_found(KeyTable *table, const char *key, Py_ssize_t length, int *from) {
    if (length > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "a record key of 4 GiB or more");
        return NULL;
    }
    if (key_table_reserve(table) < 0) {
        return NULL;
    }
    uint64_t hash = key_hash(key, length);
    KeySlot *slot = key_slot(table, key, length, hash);
    *from = slot->state;
    if (slot->state == SLOT_GARBAGE || slot->state == SLOT_COLLECTED) {
        return slot;
    }
    table->filled += slot->state == SLOT_EMPTY;
    slot->hash = hash;
    slot->length = (uint32_t)length;
    slot->state = SLOT_EMPTY;
    if (length <= INLINE_KEY) {
        memcpy(slot->key.bytes, key, (size_t)length);
    } else if ((slot->key.heap = PyMem_Malloc((size_t)length)) == NULL) {
        PyErr_NoMemory();
        return NULL;
    } else {
        memcpy(slot->key.heap, key, (size_t)length);
    }
    return slot;
}

static void key_set_state(KeyTable *table, KeySlot *slot, int state) {
    table->garbage += (state == SLOT_GARBAGE) - (slot->state == SLOT_GARBAGE);
    table->collected += (state == SLOT_COLLECTED) - (slot->state == SLOT_COLLECTED);
    if (state == SLOT_GONE) {
        slot_free_key(slot);
    }
    slot->state = state;
    table->tags[slot - table->slots] = state == SLOT_GONE ? TAG_GONE : key_tag(slot->hash);
}

/* The keys in `state` as a new set of bytes. */
static PyObject *key_set_of(KeyTable *table, int state) {
    PyObject *set = PySet_New(NULL);
    for (size_t i = 0; set != NULL && i < table->capacity; i++) {
        KeySlot *slot = &table->slots[i];
        if (slot->state == state) {
            PyObject *key = PyBytes_FromStringAndSize(slot_key(slot), slot->length);
            if (key == NULL || PySet_Add(set, key) < 0) {
                Py_CLEAR(set);
            }
            Py_XDECREF(key);
        }
    }
    return set;
}

static int fold_new_changes(Fold *fold) {
    fold->entries = PyDict_New();
    fold->reclaimed = PyDict_New();
    key_table_clear(&fold->keys);
    fold->closers = PyList_New(0);
    fold->changed = 0;
    fold->held_changes = 0;
    return fold->entries && fold->reclaimed && fold->closers ? 0 : -1;
}

static void fold_clear_pending(Fold *fold) {
    for (Py_ssize_t i = 0; i < fold->pending_count; i++) {
        Py_DECREF(fold->pending[i].state_key);
        Py_DECREF(fold->pending[i].entry);
        PyMem_Free(fold->pending[i].supersedes);
    }
    fold->pending_count = 0;
    fold->held_pending = 0;
}

static void fold_dealloc(Fold *fold) {
    fold_clear_pending(fold);
    PyMem_Free(fold->pending);
    Py_XDECREF(fold->entries);
    Py_XDECREF(fold->reclaimed);
    key_table_clear(&fold->keys);
    Py_XDECREF(fold->closers);
    Py_TYPE(fold)->tp_free((PyObject *)fold);
}

/* The record `key` superseded: garbage to reclaim (and no longer reclaimed, if it was). */
static int fold_supersede(Fold *fold, const char *key, Py_ssize_t length) {
    int from;
    KeySlot *slot = key_found(&fold->keys, key, length, &from);
    if (slot == NULL) {
        return -1;
    }
    if (from != SLOT_GARBAGE && from != SLOT_COLLECTED) {
        fold->held_changes += kept_bytes(length);
    }
    key_set_state(&fold->keys, slot, SLOT_GARBAGE);
    return 0;
}

/* W*'s open batch takes effect: each record sets its key's entry, and what it supersedes is
 * garbage. */
static int fold_close(Fold *fold) {
    for (Py_ssize_t i = 0; i < fold->pending_count; i++) {
        Pending *record = &fold->pending[i];
        PyObject *before = PyDict_GetItemWithError(fold->entries, record->state_key);
        if (before == NULL && PyErr_Occurred()) {
            return -1;
        }
        /* the dict keeps its own key object, and drops the entry it held */
        fold->held_changes += kept(record->entry) + (before == NULL ? kept(record->state_key) : 0) -
                              (before != NULL && before != Py_None ? kept(before) : 0);
        if (PyDict_SetItem(fold->entries, record->state_key, record->entry) < 0 ||
            (record->supersedes != NULL &&
             fold_supersede(fold, record->supersedes, record->supersedes_length) < 0)) {
            return -1;
        }
    }
    fold->closed = fold->pending_batch;
    fold_clear_pending(fold);
    return 0;
}

static int writer_compare(const long long a[3], const long long b[3]);

/* Whether the record `key` may be one of the open batch's: a data or delete record key of W*
 * and of a batch among theirs. A tombstone reclaims a record of the open batch only on a
 * compacted log (and rarely there), so most never look through it: a batch of n keys read
 * after compaction removed its closer would otherwise compare each of its n tombstones with
 * each of its n records. */
static int may_be_pending(Fold *fold, const char *key, Py_ssize_t key_length) {
    Record record = {0, NULL, 0, NO_BATCH, NULL, 0};
    long long writer[3];
    return fold->pending_count > 0 && read_key(key, key_length, 0, &record, NULL) &&
           record.kind == DATA && writer_numbers(record.writer, record.writer_length, writer) &&
           writer_compare(writer, fold->writer) == 0 && record.batch >= fold->pending_low &&
           record.batch <= fold->pending_high;
}

/* A tombstone of `key` (its state key, or None): out of the garbage set, and a key whose entry
 * is still that record is forgotten (a reader of a compacted log can miss what superseded it);
 * a pending record it reclaims is dropped. A key these changes do not hold goes to
 * `reclaimed`: the stored entry decides. */
static int fold_reclaim(Fold *fold, const char *key, Py_ssize_t key_length) {
    int from;
    KeySlot *slot = key_found(&fold->keys, key, key_length, &from);
    if (slot == NULL) {
        return -1;
    }
    if (from == SLOT_GARBAGE) {
        /* Superseded in these changes: the record that superseded it holds its state key's
         * entry here (or a later one), and it is no longer pending. So this tombstone changes
         * nothing else: the common case on a full log, which makes no Python object for it. */
        fold->held_changes -= kept_bytes(key_length);
        key_set_state(&fold->keys, slot, SLOT_GONE);
        return 0;
    }
    fold->held_changes += from == SLOT_COLLECTED ? 0 : kept_bytes(key_length);
    key_set_state(&fold->keys, slot, SLOT_COLLECTED);
    PyObject *record_key = NULL;
    PyObject *state_key = state_key_of(key, key_length);
    int result = -1;
    if (state_key == NULL) {
        goto done;
    }
    if (state_key != Py_None) {
        PyObject *current = PyDict_GetItemWithError(fold->entries, state_key); /* borrowed */
        if (current == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            PyObject *keys = PyDict_GetItemWithError(fold->reclaimed, state_key);
            if (keys == NULL) {
                if (PyErr_Occurred() || (keys = PySet_New(NULL)) == NULL) {
                    goto done;
                }
                int added = PyDict_SetItem(fold->reclaimed, state_key, keys);
                Py_DECREF(keys); /* the dict holds it */
                if (added < 0) {
                    goto done;
                }
                fold->held_changes += kept(state_key) + 200; /* and an empty set */
            }
            Py_ssize_t held = PySet_GET_SIZE(keys);
            if ((record_key = PyBytes_FromStringAndSize(key, key_length)) == NULL ||
                PySet_Add(keys, record_key) < 0) {
                goto done;
            }
            fold->held_changes += (PySet_GET_SIZE(keys) - held) * kept(record_key);
        } else if (current != Py_None && PyBytes_Check(current) &&
                   entry_is_of(current, key, key_length)) {
            fold->held_changes -= kept(current);
            if (PyDict_SetItem(fold->entries, state_key, Py_None) < 0) {
                goto done;
            }
        }
    }
    Py_ssize_t kept = 0;
    if (!may_be_pending(fold, key, key_length)) {
        result = 0;
        goto done;
    }
    for (Py_ssize_t i = 0; i < fold->pending_count; i++) {
        Pending record = fold->pending[i];
        if (entry_is_of(record.entry, key, key_length)) {
            fold->held_pending -= pending_kept(&record);
            Py_DECREF(record.state_key);
            Py_DECREF(record.entry);
            PyMem_Free(record.supersedes);
        } else {
            fold->pending[kept++] = record;
        }
    }
    fold->pending_count = kept;
    result = 0;
done:
    Py_XDECREF(record_key);
    Py_XDECREF(state_key);
    return result;
}

static int fold_pend(Fold *fold, long long batch, long long offset, const char *key,
                     Py_ssize_t key_length, const char *value, Py_ssize_t value_length,
                     const char *supersedes, Py_ssize_t supersedes_length) {
    if (fold->pending_count == fold->pending_capacity) {
        Py_ssize_t capacity = fold->pending_capacity < 64 ? 64 : 2 * fold->pending_capacity;
        Pending *grown = PyMem_Realloc(fold->pending, sizeof(Pending) * (size_t)capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        fold->pending = grown;
        fold->pending_capacity = capacity;
    }
    Pending record = {offset, state_key_of(key, key_length),
                      entry_of(key, key_length, value, value_length),
                      supersedes == NULL ? NULL
                                         : PyMem_Malloc(supersedes_length > 0
                                                            ? (size_t)supersedes_length
                                                            : 1),
                      supersedes_length};
    if (record.state_key == NULL || record.entry == NULL ||
        (supersedes != NULL && record.supersedes == NULL)) {
        Py_XDECREF(record.state_key);
        Py_XDECREF(record.entry);
        PyMem_Free(record.supersedes);
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return -1;
    }
    if (supersedes != NULL) {
        memcpy(record.supersedes, supersedes, (size_t)supersedes_length);
    }
    if (fold->pending_count == 0) {
        fold->pending_batch = fold->pending_low = fold->pending_high = batch;
    }
    fold->pending_low = batch < fold->pending_low ? batch : fold->pending_low;
    fold->pending_high = batch > fold->pending_high ? batch : fold->pending_high;
    fold->pending[fold->pending_count++] = record;
    fold->held_pending += pending_kept(&record);
    return 0;
}

/* 1 if writer `a` is below `b`, -1 above, 0 the same (compared as Writer orders them). */
static int writer_compare(const long long a[3], const long long b[3]) {
    for (int i = 0; i < 3; i++) {
        if (a[i] != b[i]) {
            return a[i] < b[i] ? -1 : 1;
        }
    }
    return 0;
}

/* Folds one record (changelog.py's module documentation gives the rule). `value` is NULL for
 * a tombstone and a delete; `supersedes` NULL for none. Returns 0, or -1 with an exception. */
static int fold_record(Fold *fold, int kind, const long long writer[3], long long batch,
                       long long offset, const char *key, Py_ssize_t key_length, const char *value,
                       Py_ssize_t value_length, const char *supersedes,
                       Py_ssize_t supersedes_length) {
    if (offset + 1 > fold->read_to) {
        fold->read_to = offset + 1;
    }
    fold->changed = 1;
    if (kind == TOMBSTONE) {
        return fold_reclaim(fold, key, key_length);
    }
    int compared = fold->has_writer ? writer_compare(writer, fold->writer) : 1;
    if (compared < 0) { /* an older owner writing after a newer owner's marker */
        fold->skipped++;
        return 0;
    }
    if (compared > 0) { /* a new owner: W*'s batch never closed */
        fold_clear_pending(fold);
        fold->closed = -1;
        memcpy(fold->writer, writer, sizeof(fold->writer));
        fold->has_writer = 1;
    }
    fold->applied++;
    if (batch == NO_BATCH || batch <= fold->closed) {
        return 0;
    }
    if (fold->pending_count > 0 && fold->pending_batch < batch && fold_close(fold) < 0) {
        return -1;
    }
    if (kind != CLOSE) {
        return fold_pend(fold, batch, offset, key, key_length, value, value_length, supersedes,
                         supersedes_length);
    }
    if (fold->pending_count > 0 && fold_close(fold) < 0) {
        return -1;
    }
    fold->closed = batch;
    PyObject *closer = PyBytes_FromStringAndSize(value == NULL ? "" : value, value_length);
    if (closer != NULL) {
        fold->held_changes += kept(closer);
    }
    if (append_new(fold->closers, closer) < 0) {
        return -1;
    }
    return supersedes == NULL ? 0 : fold_supersede(fold, supersedes, supersedes_length);
}

static int fold_init(Fold *fold, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"writer", "closed", "position", NULL};
    PyObject *writer = Py_None;
    long long closed = -1, position = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OLL:Fold", names, &writer, &closed,
                                     &position)) {
        return -1;
    }
    if (fold->entries != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Fold is initialized once");
        return -1;
    }
    if (writer != Py_None &&
        !PyArg_ParseTuple(writer, "LLL;a writer is (epoch, session, nonce)", &fold->writer[0],
                          &fold->writer[1], &fold->writer[2])) {
        return -1;
    }
    fold->has_writer = writer != Py_None;
    fold->closed = closed;
    fold->read_to = position;
    return fold_new_changes(fold);
}

static int fold_ready(Fold *fold) {
    if (fold->entries == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the Fold is not initialized");
        return 0;
    }
    return 1;
}

static PyObject *fold_add(Fold *fold, PyObject *args) {
    long long offset, writer[3];
    int kind;
    PyObject *batch, *supersedes;
    const char *key, *value;
    Py_ssize_t key_length, value_length;
    if (!fold_ready(fold) ||
        !PyArg_ParseTuple(args, "Li(LLL)Oy#z#O:add", &offset, &kind, &writer[0], &writer[1],
                          &writer[2], &batch, &key, &key_length, &value, &value_length,
                          &supersedes)) {
        return NULL;
    }
    if (kind < MARKER || kind > TOMBSTONE) {
        PyErr_Format(PyExc_ValueError, "no record kind %d", kind);
        return NULL;
    }
    long long number = NO_BATCH;
    if (batch != Py_None && ((number = PyLong_AsLongLong(batch)) == -1 && PyErr_Occurred())) {
        return NULL;
    }
    if (supersedes != Py_None && !PyBytes_Check(supersedes)) {
        PyErr_SetString(PyExc_TypeError, "the record key superseded is bytes or None");
        return NULL;
    }
    const char *superseded = supersedes == Py_None ? NULL : PyBytes_AS_STRING(supersedes);
    Py_ssize_t superseded_length = supersedes == Py_None ? 0 : PyBytes_GET_SIZE(supersedes);
    if (kind == DELETE || kind == TOMBSTONE) {
        value = NULL;
        value_length = 0;
    }
    if (fold_record(fold, kind, writer, number, offset, key, key_length, value, value_length,
                    superseded, superseded_length) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *fold_advance(Fold *fold, PyObject *arg) {
    long long position = PyLong_AsLongLong(arg);
    if (position == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (position > fold->read_to) {
        fold->read_to = position;
        fold->changed = 1;
    }
    Py_RETURN_NONE;
}

static long long fold_position(Fold *fold) {
    return fold->pending_count > 0 ? fold->pending[0].offset : fold->read_to;
}

static PyObject *fold_writer_tuple(Fold *fold) {
    if (!fold->has_writer) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(LLL)", fold->writer[0], fold->writer[1], fold->writer[2]);
}

static PyObject *fold_take(Fold *fold, PyObject *unused) {
    (void)unused;
    if (!fold_ready(fold)) {
        return NULL;
    }
    PyObject *writer = fold_writer_tuple(fold);
    if (writer == NULL) {
        return NULL;
    }
    PyObject *garbage = key_set_of(&fold->keys, SLOT_GARBAGE);
    PyObject *collected = garbage == NULL ? NULL : key_set_of(&fold->keys, SLOT_COLLECTED);
    if (collected == NULL) {
        Py_XDECREF(garbage);
        Py_DECREF(writer);
        return NULL;
    }
    PyObject *taken =
        Py_BuildValue("(NNNNNLNL)", fold->entries, fold->reclaimed, garbage, collected,
                      fold->closers, fold_position(fold), writer, fold->closed);
    /* The tuple took the changes (N), or they are gone with it: new ones either way. */
    fold->entries = fold->reclaimed = fold->closers = NULL;
    if (fold_new_changes(fold) < 0) {
        Py_XDECREF(taken);
        return NULL;
    }
    return taken;
}

static PyObject *fold_get_position(Fold *fold, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(fold_position(fold));
}

static PyObject *fold_get_read_to(Fold *fold, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(fold->read_to);
}

static PyObject *fold_get_held(Fold *fold, void *unused) {
    (void)unused;
    return PyLong_FromSsize_t(fold->held_changes + fold->held_pending);
}

static PyObject *fold_get_changed(Fold *fold, void *unused) {
    (void)unused;
    return PyBool_FromLong(fold->changed);
}

static PyObject *fold_get_writer(Fold *fold, void *unused) {
    (void)unused;
    return fold_writer_tuple(fold);
}

static PyObject *fold_get_closed(Fold *fold, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(fold->closed);
}

static PyObject *fold_get_pending(Fold *fold, void *unused) {
    (void)unused;
    PyObject *offsets = PyList_New(fold->pending_count);
    for (Py_ssize_t i = 0; offsets != NULL && i < fold->pending_count; i++) {
        PyObject *offset = PyLong_FromLongLong(fold->pending[i].offset);
        if (offset == NULL) {
            Py_CLEAR(offsets);
            break;
        }
        PyList_SET_ITEM(offsets, i, offset);
    }
    return offsets;
}

static PyObject *fold_get_applied(Fold *fold, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(fold->applied);
}

static PyObject *fold_get_skipped(Fold *fold, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(fold->skipped);
}

static PyMethodDef fold_methods[] = {
    {"add", (PyCFunction)fold_add, METH_VARARGS,
     "add(offset, kind, (epoch, session, nonce), batch, key, value, supersedes): fold one "
     "record (kind: an index into changelog.KIND_CODES; batch, value, supersedes may be None)"},
    {"advance", (PyCFunction)fold_advance, METH_O,
     "advance(position): the partition is read up to `position` (past commit markers)"},
    {"take", (PyCFunction)fold_take, METH_NOARGS,
     "take() -> (entries, reclaimed, garbage, collected, closers, position, writer, closed): "
     "the changes folded since the last take, and where the fold stands"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef fold_getset[] = {
    {"position", (getter)fold_get_position, NULL,
     "the offset to resume from: the open batch's first record, or read_to", NULL},
    {"read_to", (getter)fold_get_read_to, NULL, "the offset after the last record read", NULL},
    {"held", (getter)fold_get_held, NULL, "about the memory the changes not taken and the open batch hold", NULL},
    {"changed", (getter)fold_get_changed, NULL, "whether anything changed since the last take",
     NULL},
    {"writer", (getter)fold_get_writer, NULL, "W*, (epoch, session, nonce), or None", NULL},
    {"closed", (getter)fold_get_closed, NULL, "the batch W* last closed (-1: none)", NULL},
    {"pending", (getter)fold_get_pending, NULL, "the offsets of W*'s open batch's records",
     NULL},
    {"applied", (getter)fold_get_applied, NULL, "records of W* or a newer writer, so far", NULL},
    {"skipped", (getter)fold_get_skipped, NULL, "records of an older writer ignored, so far",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FoldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "smoothscale.runtime._changelog.Fold",
    .tp_doc = "Fold(writer=None, closed=-1, position=0): the fold of one changelog partition, "
              "from a store's W*, closed batch and position.",
    .tp_basicsize = sizeof(Fold),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)fold_init,
    .tp_dealloc = (destructor)fold_dealloc,
    .tp_methods = fold_methods,
    .tp_getset = fold_getset,
};

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

/* Ends a read() waiting for messages on another thread at once (it returns what it has), or
 * the next one if none is waiting. Nothing on a closed consumer. */
static PyObject *wake(PyObject *module, PyObject *consumer) {
    (void)module;
    rd_kafka_t **rk = PyCapsule_GetPointer(consumer, CAPSULE);
    if (rk == NULL) {
        return NULL;
    }
    if (*rk != NULL) {
        rd_kafka_queue_t *queue = rdk.queue_get_consumer(*rk);
        if (queue != NULL) {
            rdk.queue_yield(queue);
            rdk.queue_destroy(queue);
        }
    }
    Py_RETURN_NONE;
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

/* Per partition a read meets: its fold (a new reference; NULL: no fold, its records are not
 * read), whether it failed in this read (the slow path refused a record), and records read. */
typedef struct {
    const rd_kafka_topic_t *topic;
    int32_t partition;
    Fold *fold;
    int failed;
    long long count;
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t count, capacity;
} Slots;

/* The slot of a message's partition, looked up in `folds` ((topic, partition) -> Fold) the
 * first time; NULL with an exception set. */
static Slot *slot_of(Slots *slots, PyObject *folds, Names *names,
                     const rd_kafka_message_t *message) {
    for (Py_ssize_t i = 0; i < slots->count; i++) {
        Slot *slot = &slots->slots[i];
        if (slot->topic == message->rkt && slot->partition == message->partition) {
            return slot;
        }
    }
    if (slots->count == slots->capacity) {
        Py_ssize_t capacity = slots->capacity < 16 ? 16 : 2 * slots->capacity;
        Slot *grown = PyMem_Realloc(slots->slots, sizeof(Slot) * (size_t)capacity);
        if (grown == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        slots->slots = grown;
        slots->capacity = capacity;
    }
    PyObject *topic = name_of(names, message->rkt);
    if (topic == NULL) {
        return NULL;
    }
    PyObject *key = Py_BuildValue("(Oi)", topic, (int)message->partition);
    if (key == NULL) {
        return NULL;
    }
    PyObject *fold = PyDict_GetItemWithError(folds, key); /* borrowed */
    Py_DECREF(key);
    if (fold == NULL && PyErr_Occurred()) {
        return NULL;
    }
    if (fold != NULL && !PyObject_TypeCheck(fold, &FoldType)) {
        PyErr_SetString(PyExc_TypeError, "read() takes a dict of (topic, partition) -> Fold");
        return NULL;
    }
    Slot *slot = &slots->slots[slots->count++];
    *slot = (Slot){message->rkt, message->partition, (Fold *)Py_XNewRef(fold), 0, 0};
    return slot;
}

/* Folds one message into its partition's fold, or appends it to `errors` (an error event).
 * Returns 0, or -1 with an exception set. */
static int read_message(const rd_kafka_message_t *message, PyObject *folds, PyObject *slow,
                        PyObject *errors, Slots *slots, Names *names, LastWriter *last) {
    if (message->err != 0) {
        PyObject *topic = message->rkt == NULL ? Py_None : name_of(names, message->rkt);
        if (topic == NULL) {
            return -1;
        }
        return append_new(errors, Py_BuildValue("(Oiis)", topic, (int)message->partition,
                                                message->err, rdk.err2str(message->err)));
    }
    Slot *slot = slot_of(slots, folds, names, message);
    if (slot == NULL) {
        return -1;
    }
    if (slot->fold == NULL || slot->failed) {
        return 0;
    }
    slot->count++;
    rd_kafka_headers_t *headers = NULL;
    if (rdk.message_headers(message, &headers) != 0) {
        headers = NULL;
    }
    Record record = {0, NULL, 0, NO_BATCH, NULL, 0};
    long long writer[3];
    const char *key = message->key;
    Py_ssize_t key_length = (Py_ssize_t)message->key_len;
    int fast = 0;
    if (key != NULL) {
        if (message->payload == NULL) {
            record.kind = TOMBSTONE;
            fast = 1;
        } else {
            fast = read_key(key, key_length, message->len == 0, &record, last);
        }
        fast = fast && read_headers(headers, &record, last) &&
               known_writer_numbers(last, record.writer, record.writer_length, writer);
    }
    if (fast) {
        int valued = record.kind != TOMBSTONE && record.kind != DELETE;
        return fold_record(slot->fold, record.kind, writer, record.batch, message->offset, key,
                           key_length, valued ? message->payload : NULL,
                           valued ? (Py_ssize_t)message->len : 0, record.supersedes,
                           record.supersedes_length);
    }
    PyObject *topic = name_of(names, message->rkt);
    if (topic == NULL) {
        return -1;
    }
    PyObject *read = PyObject_CallFunction(
        slow, "OOi(LNNN)", (PyObject *)slot->fold, topic, (int)message->partition,
        (long long)message->offset, bytes_or_none(key, key_length),
        bytes_or_none(message->payload, message->len), headers_of(headers));
    if (read == NULL) {
        return -1;
    }
    int kept = PyObject_IsTrue(read);
    Py_DECREF(read);
    if (kept < 0) {
        return -1;
    }
    if (!kept) { /* the task failed: none of its records is read any more */
        for (Py_ssize_t i = 0; i < slots->count; i++) {
            if (slots->slots[i].partition == message->partition) {
                slots->slots[i].failed = 1;
            }
        }
    }
    return 0;
}

static PyObject *read_folded(PyObject *module, PyObject *args) {
    (void)module;
    PyObject *consumer, *folds, *slow;
    Py_ssize_t count;
    double timeout;
    if (!PyArg_ParseTuple(args, "OndO!O:read", &consumer, &count, &timeout, &PyDict_Type, &folds,
                          &slow)) {
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
        /* librdkafka's batch consume waits for all `count` messages or the timeout, so a read
         * asks it for one message, then for what is queued. (Asked for a whole chunk, the last
         * read of every restore waited out its timeout: 20 ms of a 0.25 s restore.) */
        int timeout_ms = milliseconds(timeout);
        Py_BEGIN_ALLOW_THREADS
        consumed = rdk.consume_batch_queue(queue, timeout_ms, messages, 1);
        if (consumed == 1 && count > 1) {
            ssize_t more = rdk.consume_batch_queue(queue, 0, messages + 1, (size_t)count - 1);
            consumed += more > 0 ? more : 0;
        }
        Py_END_ALLOW_THREADS
        rdk.queue_destroy(queue);
    }
    if (consumed < 0) {
        PyMem_Free(messages);
        PyErr_SetString(PyExc_RuntimeError, "librdkafka could not consume (no consumer queue)");
        return NULL;
    }
    PyObject *errors = PyList_New(0), *counts = PyDict_New();
    int failed = errors == NULL || counts == NULL;
    Names names = {.count = 0};
    Slots slots = {NULL, 0, 0};
    LastWriter last = {.length = 0};
    for (ssize_t i = 0; i < consumed; i++) {
        failed =
            failed || read_message(messages[i], folds, slow, errors, &slots, &names, &last) < 0;
        rdk.message_destroy(messages[i]);
    }
    for (Py_ssize_t i = 0; i < slots.count; i++) {
        Slot *slot = &slots.slots[i];
        if (!failed && slot->count > 0) {
            PyObject *task = PyLong_FromLong(slot->partition);
            PyObject *before = task == NULL ? NULL : PyDict_GetItemWithError(counts, task);
            long long total = slot->count + (before == NULL ? 0 : PyLong_AsLongLong(before));
            PyObject *sum = PyLong_FromLongLong(total);
            failed = task == NULL || sum == NULL || PyErr_Occurred() != NULL ||
                     PyDict_SetItem(counts, task, sum) < 0;
            Py_XDECREF(task);
            Py_XDECREF(sum);
        }
        Py_XDECREF(slot->fold);
    }
    PyMem_Free(slots.slots);
    for (int i = 0; i < names.count; i++) {
        Py_DECREF(names.names[i]);
    }
    PyMem_Free(messages);
    if (failed) {
        Py_XDECREF(errors);
        Py_XDECREF(counts);
        return NULL;
    }
    return Py_BuildValue("(nNN)", (Py_ssize_t)consumed, counts, errors);
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
    {"wake", wake, METH_O,
     "wake(consumer): a read() waiting for messages on another thread returns at once (or the "
     "next one, if none is waiting)"},
    {"read", read_folded, METH_VARARGS,
     "read(consumer, count, timeout, folds, slow) -> (messages consumed, {task: records read}, "
     "[(topic, partition, error code, text)]): consume up to `count` changelog messages, "
     "waiting at most `timeout` seconds, and fold each into its partition's Fold (`folds`: "
     "(topic, partition) -> Fold; a partition without one is not read). A record the fast path "
     "does not read goes to slow(fold, topic, partition, (offset, key, value, headers)), which "
     "folds it and returns True, or returns False: the partition's task failed."},
    {"forget_reclaimed", forget_reclaimed, METH_VARARGS,
     "forget_reclaimed(entries, record_keys, state_keys) -> indexes: the tombstones of "
     "record_keys (each of state_keys, None for no state key) set to None the keys of `entries` "
     "(state key -> entry or None) whose entry is still that record; returns the indexes of "
     "the records whose state key `entries` does not hold."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_changelog",
    "The restore's per-record work in C: consuming changelog records and folding them into "
    "the changes to write to a task's store.",
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
        {(void **)&rdk.queue_yield, "rd_kafka_queue_yield"},
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
    if (PyType_Ready(&FoldType) < 0) {
        return NULL;
    }
    PyObject *made = PyModule_Create(&module);
    if (made != NULL && PyModule_AddObjectRef(made, "Fold", (PyObject *)&FoldType) < 0) {
        Py_CLEAR(made);
    }
    return made;
}
