/* The restore's per-record work in C: splitting consumed changelog messages into runs.
 *
 * smoothscale.runtime.changelog defines the record format (parse_record) and the rule that
 * restores a state from it (fold_runs); this module only makes reading it cheap, as CPython's
 * _json does for json. runs(messages) walks a list of consumed messages (confluent-kafka
 * Messages, or anything with their methods) and groups consecutive records of one partition
 * with the same kind, writer and batch into a run:
 *
 *     (topic, partition, kind, writer, batch, offsets, keys, values, supersedes, state_keys)
 *
 * kind: 0 marker, 1 close, 2 data, 3 delete, 4 tombstone (changelog.KIND_CODES); writer: its
 * text, E.S.N (from the key, or a tombstone's header); batch: int or None; then one list entry
 * per record: its offset, key, value (None for a tombstone), the record key it supersedes (or
 * None) and, for a record key of the form d:<state key>@..., that state key (or None).
 *
 * A message it does not read on this fast path (an error, an unusual header, anything
 * parse_record would reject or read in a way of its own) becomes an item of its own,
 * (topic, partition, -1, message, None, ...): the caller reads it with parse_record, which
 * says what is wrong. Every record read here is one parse_record reads the same way
 * (tests/runtime/test_changelog_runs.py compares the two).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { MARKER, CLOSE, DATA, DELETE, TOMBSTONE };
#define SLOW (-1)
#define ITEM_SIZE 10
#define NO_BATCH (-1)

static PyObject *method_error, *method_topic, *method_partition, *method_offset, *method_key,
    *method_value, *method_headers;

/* What one record is, as read on the fast path. */
typedef struct {
    int kind;
    const char *writer; /* the writer's text "E.S.N", in the key or the header */
    Py_ssize_t writer_length;
    PyObject *writer_header; /* a tombstone's writer header (borrowed), or NULL */
    long long batch;         /* NO_BATCH: none */
    PyObject *supersedes;    /* borrowed, or NULL */
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
 * and value: 1 if read, 0 if the record is for the slow path. */
static int read_key(PyObject *key, PyObject *value, Record *record) {
    const char *text = PyBytes_AS_STRING(key);
    Py_ssize_t length = PyBytes_GET_SIZE(key), at = length - 1;
    while (at >= 0 && text[at] != '@') {
        at--;
    }
    if (length >= 2 && text[0] == 'd' && text[1] == ':' && at >= 2) {
        record->kind = PyBytes_GET_SIZE(value) > 0 ? DATA : DELETE;
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

/* Reads the headers smoothscale writes (None, or a list of (str, bytes) pairs; the last of a
 * name counts, as in dict(headers)): 1 if read, 0 if the record is for the slow path. */
static int read_headers(PyObject *headers, Record *record) {
    PyObject *writer = NULL, *supersedes = NULL;
    if (headers != Py_None) {
        if (!PyList_Check(headers)) {
            return 0;
        }
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(headers); i++) {
            PyObject *pair = PyList_GET_ITEM(headers, i);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
                return 0;
            }
            PyObject *name = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
            if (PyUnicode_CompareWithASCIIString(name, "smoothscale.writer") == 0) {
                writer = value;
            } else if (PyUnicode_CompareWithASCIIString(name, "smoothscale.supersedes") == 0) {
                supersedes = value;
            }
        }
    }
    if (supersedes != NULL && supersedes != Py_None && !PyBytes_Check(supersedes)) {
        return 0;
    }
    record->supersedes = supersedes == Py_None ? NULL : supersedes;
    record->writer_header = NULL;
    if (record->kind == TOMBSTONE) {
        if (writer == NULL || !PyBytes_Check(writer)) {
            return 0;
        }
        record->writer = PyBytes_AS_STRING(writer);
        record->writer_length = PyBytes_GET_SIZE(writer);
        Py_ssize_t read = writer_length(record->writer, record->writer_length);
        if (read == 0 || read != record->writer_length) {
            return 0;
        }
        record->writer_header = writer;
    }
    return 1;
}

/* The state key of a record key d:<state key>@... (a new reference), or None. */
static PyObject *state_key_of(PyObject *key) {
    const char *text = PyBytes_AS_STRING(key);
    Py_ssize_t length = PyBytes_GET_SIZE(key);
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

static PyObject *call(PyObject *object, PyObject *method) {
    return PyObject_CallMethodNoArgs(object, method);
}

/* A new run item for its first record (lists empty). */
static PyObject *new_run(PyObject *topic, PyObject *partition, const Record *record) {
    PyObject *item = PyTuple_New(ITEM_SIZE);
    if (item == NULL) {
        return NULL;
    }
    Py_INCREF(topic);
    PyTuple_SET_ITEM(item, 0, topic);
    Py_INCREF(partition);
    PyTuple_SET_ITEM(item, 1, partition);
    PyTuple_SET_ITEM(item, 2, PyLong_FromLong(record->kind));
    if (record->writer_header != NULL) {
        Py_INCREF(record->writer_header);
        PyTuple_SET_ITEM(item, 3, record->writer_header);
    } else {
        PyTuple_SET_ITEM(item, 3, PyBytes_FromStringAndSize(record->writer, record->writer_length));
    }
    if (record->batch == NO_BATCH) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(item, 4, Py_None);
    } else {
        PyTuple_SET_ITEM(item, 4, PyLong_FromLongLong(record->batch));
    }
    for (int i = 5; i < ITEM_SIZE; i++) {
        PyTuple_SET_ITEM(item, i, PyList_New(0));
    }
    for (int i = 2; i < ITEM_SIZE; i++) {
        if (PyTuple_GET_ITEM(item, i) == NULL) {
            Py_DECREF(item);
            return NULL;
        }
    }
    return item;
}

/* An item for a message the fast path leaves to parse_record. */
static PyObject *slow_item(PyObject *topic, PyObject *partition, PyObject *message) {
    PyObject *item = PyTuple_New(ITEM_SIZE);
    if (item == NULL) {
        return NULL;
    }
    PyObject *fields[ITEM_SIZE] = {topic, partition, NULL, message, Py_None, Py_None,
                                   Py_None, Py_None, Py_None, Py_None};
    for (int i = 0; i < ITEM_SIZE; i++) {
        if (i == 2) {
            PyObject *slow = PyLong_FromLong(SLOW);
            if (slow == NULL) {
                Py_DECREF(item);
                return NULL;
            }
            PyTuple_SET_ITEM(item, i, slow);
            continue;
        }
        Py_INCREF(fields[i]);
        PyTuple_SET_ITEM(item, i, fields[i]);
    }
    return item;
}

static int append_new(PyObject *list, PyObject *object) {
    if (object == NULL) {
        return -1;
    }
    int result = PyList_Append(list, object);
    Py_DECREF(object);
    return result;
}

static int append(PyObject *list, PyObject *object) {
    return PyList_Append(list, object == NULL ? Py_None : object);
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
    PyObject *pairs[2][2] = {{PyTuple_GET_ITEM(run, 0), topic}, {PyTuple_GET_ITEM(run, 1), partition}};
    for (int i = 0; i < 2; i++) {
        if (pairs[i][0] != pairs[i][1]) {
            int equal = PyObject_RichCompareBool(pairs[i][0], pairs[i][1], Py_EQ);
            if (equal != 1) {
                return equal;
            }
        }
    }
    return 1;
}

/* Reads one message onto `items`. `*run` is the run item the message may continue (borrowed:
 * `items` holds it; NULL: none), and is set to the one the next message may continue.
 * Returns 0, or -1 with an exception set. */
static int read_message(PyObject *message, PyObject *items, PyObject **run) {
    int result = -1, fast = 0;
    PyObject *error = NULL, *topic = NULL, *partition = NULL, *offset = NULL, *key = NULL,
             *value = NULL, *headers = NULL, *state_key = NULL;
    Record record = {0, NULL, 0, NULL, NO_BATCH, NULL};
    if ((error = call(message, method_error)) == NULL ||
        (topic = call(message, method_topic)) == NULL ||
        (partition = call(message, method_partition)) == NULL) {
        goto done;
    }
    if (error == Py_None && PyUnicode_Check(topic) && PyLong_Check(partition)) {
        if ((offset = call(message, method_offset)) == NULL ||
            (key = call(message, method_key)) == NULL ||
            (value = call(message, method_value)) == NULL ||
            (headers = call(message, method_headers)) == NULL) {
            goto done;
        }
        if (PyLong_Check(offset) && PyBytes_Check(key)) {
            if (value == Py_None) {
                record.kind = TOMBSTONE;
                fast = 1;
            } else if (PyBytes_Check(value)) {
                fast = read_key(key, value, &record);
            }
            fast = fast && read_headers(headers, &record);
        }
    }
    if (fast && record.kind != MARKER && record.kind != CLOSE) {
        if ((state_key = state_key_of(key)) == NULL) {
            goto done;
        }
    }
    if (!fast) {
        *run = NULL;
        result = append_new(items, slow_item(topic, partition, message));
        goto done;
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
    if (append(PyTuple_GET_ITEM(*run, 5), offset) < 0 ||
        append(PyTuple_GET_ITEM(*run, 6), key) < 0 ||
        append(PyTuple_GET_ITEM(*run, 7), value) < 0 ||
        append(PyTuple_GET_ITEM(*run, 8), record.supersedes) < 0 ||
        append(PyTuple_GET_ITEM(*run, 9), state_key) < 0) {
        goto done;
    }
    result = 0;
done:
    Py_XDECREF(error);
    Py_XDECREF(topic);
    Py_XDECREF(partition);
    Py_XDECREF(offset);
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    Py_XDECREF(state_key);
    return result;
}

static PyObject *runs(PyObject *module, PyObject *messages) {
    (void)module;
    if (!PyList_Check(messages)) {
        PyErr_SetString(PyExc_TypeError, "runs() takes a list of messages");
        return NULL;
    }
    PyObject *items = PyList_New(0);
    if (items == NULL) {
        return NULL;
    }
    PyObject *run = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(messages); i++) {
        if (read_message(PyList_GET_ITEM(messages, i), items, &run) < 0) {
            Py_DECREF(items);
            return NULL;
        }
    }
    return items;
}

static PyMethodDef methods[] = {
    {"runs", runs, METH_O,
     "The runs of consecutive records of one partition, kind, writer and batch in a list of "
     "changelog messages (see the module's documentation)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_changelog",
    "The restore's per-record work in C: splitting changelog messages into runs.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__changelog(void) {
    PyObject **names[] = {&method_error, &method_topic, &method_partition, &method_offset,
                          &method_key, &method_value, &method_headers};
    const char *texts[] = {"error", "topic", "partition", "offset", "key", "value", "headers"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == NULL) {
            return NULL;
        }
    }
    return PyModule_Create(&module);
}
