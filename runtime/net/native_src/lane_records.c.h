/*
 * The native lane's records (part of lane.c, included by it: one translation unit, so
 * its helpers are lane.c's; `runtime.net.lane` hashes this file into the build's key).
 */
/* ---- the records of the requests the lane answered ------------------------------------- */
/*
 * `Records()`: what `add_record` wrote of each request the lane answered, packed in C
 * until something reads them: `EventMaker.make` reads them where they are (the drain's
 * access-log lines and metric groups, and the events when made at once), the ring keeps
 * the whole object as one item (runtime/observe/ring.py `Chunk`) and the events of the
 * records it still holds are made when read. A record costs no Python object of its
 * own: 14 of them a request (a tuple, its float, ints and bytes) made and, once the
 * ring let them go, freed, were a tenth of a WASM hello's CPU in the PoP.
 *
 * Read from Python as a sequence of the tuples `record_tuple` makes (len, an index,
 * a slice: a list of them), and made of them (`Records(tuples)`: tests); `truncate(n)`
 * drops those past the first n; `served()`
 * counts them by (route, method code) for http_cache's stats. Loop thread only, while
 * the lane appends (`NativeLane.records`); what the drain took is only read after.
 */
typedef struct {
    double ts;
    uint64_t number, took, bytes_in;  /* number: the id's when the caller gave none */
    uint32_t status, size;
    int32_t route, verdict, method;
    uint32_t kept_len, query_len, path_len;  /* bytes of each in the arena, in this order */
    int32_t has_path;  /* 0: the route's own path (None) */
    size_t at;  /* where its kept id, query and path start in the arena */
    PyObject *host, *client, *refused;  /* bytes, str, and NULL or the refusal's pair: owned */
} rec_t;

typedef struct {
    PyObject_HEAD
    rec_t *r;
    Py_ssize_t n, cap;
    char *arena;
    size_t used, arena_cap;
} Records;

static void Records_drop(Records *s, Py_ssize_t from) {
    for (Py_ssize_t i = from; i < s->n; i++) {
        Py_DECREF(s->r[i].host);
        Py_DECREF(s->r[i].client);
        Py_XDECREF(s->r[i].refused);
    }
    if (from < s->n) s->used = from ? s->r[from].at : 0;
    s->n = from < s->n ? from : s->n;
}

static void Records_dealloc(Records *s) {
    PyTypeObject *tp = Py_TYPE(s);
    Records_drop(s, 0);
    free(s->r);
    free(s->arena);
    tp->tp_free((PyObject *)s);
    Py_DECREF(tp);
}

static int is_records(PyObject *o) {
    return Py_TYPE(o)->tp_dealloc == (destructor)Records_dealloc;
}

/* One record appended to `records` (a `Records` the drain takes: runtime/pipeline/lane.py
 * `NativeLane.drain`, through `EventMaker.make`): `kept` the caller's request id
 * (`kept_len` bytes) or NULL for `number`'s, `host` and `query` the request's, `path`
 * NULL for its route's own, `client` the connection's "ip:port" str, `refused` NULL,
 * or for a request ratelimit or bots refused (`refuse`) the pair (its decisions, the
 * error) its event carries. The host's bytes object is the record before's when the
 * same (a connection's requests name one). Every request the lane answers is recorded
 * here and only here. 0, or -1 with a Python error (MemoryError). */
static int add_record(PyObject *records, double ts, uint64_t number, const char *kept,
                      size_t kept_len, int route, uint32_t status, uint32_t size,
                      uint64_t took, int verdict, int method, const char *host,
                      size_t host_len, const char *query, size_t query_len, PyObject *client,
                      uint64_t bytes_in, const char *path, size_t path_len,
                      PyObject *refused) {
    Records *s = (Records *)records;
    if (kept_len > UINT32_MAX || query_len > UINT32_MAX || path_len > UINT32_MAX) {
        PyErr_NoMemory();
        return -1;
    }
    size_t text = (kept ? kept_len : 0) + query_len + (path ? path_len : 0);
    if (s->n == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 64;
        rec_t *p = realloc(s->r, (size_t)cap * sizeof *p);
        if (!p) { PyErr_NoMemory(); return -1; }
        s->r = p;
        s->cap = cap;
    }
    if (s->used + text > s->arena_cap) {
        size_t cap = s->arena_cap ? s->arena_cap : 1024;
        while (cap < s->used + text) cap *= 2;
        char *p = realloc(s->arena, cap);
        if (!p) { PyErr_NoMemory(); return -1; }
        s->arena = p;
        s->arena_cap = cap;
    }
    PyObject *h = s->n ? s->r[s->n - 1].host : NULL;
    if (h && (size_t)PyBytes_GET_SIZE(h) == host_len &&
            memcmp(PyBytes_AS_STRING(h), host, host_len) == 0)
        Py_INCREF(h);
    else if (!(h = PyBytes_FromStringAndSize(host, (Py_ssize_t)host_len)))
        return -1;
    rec_t *r = &s->r[s->n++];
    r->ts = ts;
    r->number = kept ? 0 : number;
    r->took = took;
    r->bytes_in = bytes_in;
    r->status = status;
    r->size = size;
    r->route = route;
    r->verdict = verdict;
    r->method = method;
    r->kept_len = kept ? (uint32_t)kept_len : 0;
    r->query_len = (uint32_t)query_len;
    r->has_path = path != NULL;
    r->path_len = path ? (uint32_t)path_len : 0;
    r->at = s->used;
    char *o = s->arena ? s->arena + s->used : NULL;
    if (r->kept_len) memcpy(o, kept, kept_len);
    if (query_len) memcpy(o + r->kept_len, query, query_len);
    if (r->path_len) memcpy(o + r->kept_len + query_len, path, path_len);
    s->used += text;
    r->host = h;
    r->client = Py_NewRef(client);
    r->refused = refused ? Py_NewRef(refused) : NULL;
    return 0;
}

static const char *rec_kept(const Records *s, const rec_t *r) { return s->arena + r->at; }
static const char *rec_query(const Records *s, const rec_t *r) {
    return r->query_len ? s->arena + r->at + r->kept_len : "";
}
static const char *rec_path(const Records *s, const rec_t *r) {
    return s->arena + r->at + r->kept_len + r->query_len;
}

/* Record `i` as a tuple (ts, id, route, status, body bytes, took ns, verdict, method,
 * host, query, client, request body bytes, path, refused): `id` the caller's (bytes)
 * or the number (int), `method` an MC_* code, `host` and `query` bytes, `path` None
 * for the route's own, else bytes, `refused` None or the refusal's pair; what
 * `EventMaker.make` also takes in a list. A new reference, NULL with a Python error. */
static PyObject *record_tuple(const Records *s, Py_ssize_t i) {
    const rec_t *r = &s->r[i];
    return Py_BuildValue(
        "(dNiIIKiiONOKNO)", r->ts,
        r->kept_len ? PyBytes_FromStringAndSize(rec_kept(s, r), r->kept_len)
                    : PyLong_FromUnsignedLongLong(r->number),
        (int)r->route, (unsigned int)r->status, (unsigned int)r->size,
        (unsigned long long)r->took, (int)r->verdict, (int)r->method, r->host,
        PyBytes_FromStringAndSize(rec_query(s, r), r->query_len), r->client,
        (unsigned long long)r->bytes_in,
        r->has_path ? PyBytes_FromStringAndSize(rec_path(s, r), r->path_len)
                    : Py_NewRef(Py_None),
        r->refused ? r->refused : Py_None);
}

/* One record as `make_one` reads it: a `Records`' (`packed_view`) or a tuple's
 * (`tuple_view`, what `record_tuple` makes). Its objects are borrowed. */
typedef struct {
    double ts;
    unsigned long long number, took, size, bytes_in;
    const char *kept;  /* the caller's id (kept_len bytes), or NULL: `number`'s */
    size_t kept_len;
    long ri, status, verdict, method;
    PyObject *host, *client, *refused;  /* bytes, str, NULL or the refusal's pair */
    const char *query, *path;  /* path NULL: its route's own */
    size_t query_len, path_len;
} view_t;

static void packed_view(const Records *s, Py_ssize_t i, view_t *v) {
    const rec_t *r = &s->r[i];
    v->ts = r->ts;
    v->number = r->number;
    v->took = r->took;
    v->size = r->size;
    v->bytes_in = r->bytes_in;
    v->kept = r->kept_len ? rec_kept(s, r) : NULL;
    v->kept_len = r->kept_len;
    v->ri = r->route;
    v->status = r->status;
    v->verdict = r->verdict;
    v->method = r->method;
    v->host = r->host;
    v->client = r->client;
    v->refused = r->refused;
    v->query = rec_query(s, r);
    v->query_len = r->query_len;
    v->path = r->has_path ? rec_path(s, r) : NULL;
    v->path_len = r->path_len;
}

/* `rec`, a tuple as `record_tuple` makes it, into `v`: 0, or -1 with a Python error
 * (TypeError, ValueError: not such a tuple). */
static int tuple_view(PyObject *rec, view_t *v) {
    if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 14) {
        PyErr_SetString(PyExc_TypeError, "a record: a 14-tuple (add_record)");
        return -1;
    }
    PyObject **r = &PyTuple_GET_ITEM(rec, 0);
    v->ts = PyFloat_AsDouble(r[0]);
    int kept = PyBytes_Check(r[1]);  /* the caller's id, else a number */
    v->number = kept ? 0 : PyLong_AsUnsignedLongLong(r[1]);
    v->ri = PyLong_AsLong(r[2]);
    v->status = PyLong_AsLong(r[3]);
    v->took = PyLong_AsUnsignedLongLong(r[5]);
    v->size = PyLong_AsUnsignedLongLong(r[4]);
    v->verdict = PyLong_AsLong(r[6]);
    v->method = PyLong_AsLong(r[7]);
    v->bytes_in = PyLong_Check(r[11]) ? PyLong_AsUnsignedLongLong(r[11]) : 0;
    if (PyErr_Occurred()) return -1;
    if (!PyLong_Check(r[11]) || !PyBytes_Check(r[8]) || !PyBytes_Check(r[9]) ||
            !PyUnicode_Check(r[10]) || v->status < 0 || v->status > UINT32_MAX ||
            (kept && (PyBytes_GET_SIZE(r[1]) == 0 || PyBytes_GET_SIZE(r[1]) > 128)) ||
            (r[12] != Py_None && !PyBytes_Check(r[12])) ||
            (r[13] != Py_None && (!PyTuple_Check(r[13]) || PyTuple_GET_SIZE(r[13]) != 2 ||
                                  !PyDict_Check(PyTuple_GET_ITEM(r[13], 0)) ||
                                  !PyUnicode_Check(PyTuple_GET_ITEM(r[13], 1))))) {
        PyErr_SetString(PyExc_ValueError, "a record names no route or verdict, or is mistyped");
        return -1;
    }
    v->kept = kept ? PyBytes_AS_STRING(r[1]) : NULL;
    v->kept_len = kept ? (size_t)PyBytes_GET_SIZE(r[1]) : 0;
    v->host = r[8];
    v->query = PyBytes_AS_STRING(r[9]);
    v->query_len = (size_t)PyBytes_GET_SIZE(r[9]);
    v->client = r[10];
    v->path = r[12] == Py_None ? NULL : PyBytes_AS_STRING(r[12]);
    v->path_len = r[12] == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(r[12]);
    v->refused = r[13] == Py_None ? NULL : r[13];
    return 0;
}

/* Records([records]): `records` an iterable of the tuples `record_tuple` makes, each
 * added as the lane adds its own (tests compare what each reads as); TypeError,
 * ValueError for one that is not such a tuple. */
static int Records_init(Records *s, PyObject *args, PyObject *kw) {
    PyObject *from = NULL;
    if ((kw && PyDict_GET_SIZE(kw)) || !PyArg_ParseTuple(args, "|O:Records", &from))
        return -1;
    Records_drop(s, 0);
    PyObject *it = from ? PyObject_GetIter(from) : NULL, *rec;
    if (from && !it) return -1;
    while (it && (rec = PyIter_Next(it))) {
        view_t v;
        int err = tuple_view(rec, &v) ||
                  add_record((PyObject *)s, v.ts, v.number, v.kept, v.kept_len, (int)v.ri,
                             (uint32_t)v.status, (uint32_t)v.size, v.took, (int)v.verdict,
                             (int)v.method, PyBytes_AS_STRING(v.host),
                             (size_t)PyBytes_GET_SIZE(v.host), v.query, v.query_len,
                             v.client, v.bytes_in, v.path, v.path_len, v.refused);
        Py_DECREF(rec);
        if (err) { Py_DECREF(it); return -1; }
    }
    Py_XDECREF(it);
    return PyErr_Occurred() ? -1 : 0;
}

static Py_ssize_t Records_len(Records *s) { return s->n; }

static PyObject *Records_item(Records *s, Py_ssize_t i) {
    if (i < 0 || i >= s->n) {
        PyErr_SetString(PyExc_IndexError, "record index out of range");
        return NULL;
    }
    return record_tuple(s, i);
}

static PyObject *Records_subscript(Records *s, PyObject *key) {
    if (!PySlice_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) return NULL;
        return Records_item(s, i < 0 ? i + s->n : i);
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(key, &start, &stop, &step) < 0) return NULL;
    Py_ssize_t n = PySlice_AdjustIndices(s->n, &start, &stop, step);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t k = 0; out && k < n; k++) {
        PyObject *t = record_tuple(s, start + k * step);
        if (!t) Py_CLEAR(out);
        else PyList_SET_ITEM(out, k, t);
    }
    return out;
}

static PyObject *Records_truncate(Records *s, PyObject *arg) {
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "truncate(n): n >= 0");
        return NULL;
    }
    Records_drop(s, n);
    Py_RETURN_NONE;
}

/* served() -> [(route, method, n)]: the records ratelimit or bots did not refuse, counted
 * by route and method code (what http_cache's stats count of them). */
static PyObject *Records_served(Records *s, PyObject *unused) {
    (void)unused;
    PyObject *counts = PyDict_New();
    for (Py_ssize_t i = 0; counts && i < s->n; i++) {
        if (s->r[i].refused) continue;
        PyObject *key = Py_BuildValue("(ii)", (int)s->r[i].route, (int)s->r[i].method);
        PyObject *was = key ? PyDict_GetItemWithError(counts, key) : NULL;
        PyObject *now = key && !PyErr_Occurred()
                            ? PyLong_FromLong((was ? PyLong_AsLong(was) : 0) + 1) : NULL;
        if (!now || PyDict_SetItem(counts, key, now)) Py_CLEAR(counts);
        Py_XDECREF(key);
        Py_XDECREF(now);
    }
    if (!counts) return NULL;
    PyObject *out = PyList_New(0), *key, *value;
    Py_ssize_t pos = 0;
    while (out && PyDict_Next(counts, &pos, &key, &value)) {
        PyObject *t = Py_BuildValue("(OOO)", PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(key, 1),
                                    value);
        if (!t || PyList_Append(out, t)) Py_CLEAR(out);
        Py_XDECREF(t);
    }
    Py_DECREF(counts);
    return out;
}

static PyMethodDef RECORDS_METHODS[] = {
    {"truncate", (PyCFunction)Records_truncate, METH_O,
     "truncate(n): drop the records past the first n"},
    {"served", (PyCFunction)Records_served, METH_NOARGS,
     "served() -> [(route, method, n)] of the records not refused"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot RECORDS_SLOTS[] = {
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Records_init},
    {Py_tp_dealloc, Records_dealloc},
    {Py_tp_methods, RECORDS_METHODS},
    {Py_sq_length, Records_len},
    {Py_sq_item, Records_item},
    {Py_mp_length, Records_len},
    {Py_mp_subscript, Records_subscript},
    {0, NULL}};

/* not GC-tracked: what a record holds (bytes, a str, a refusal's dict and str) never
 * refers back to a Records */
static PyType_Spec RECORDS_SPEC = {"_edgefn_lane.Records", sizeof(Records), 0,
                                   Py_TPFLAGS_DEFAULT, RECORDS_SLOTS};
