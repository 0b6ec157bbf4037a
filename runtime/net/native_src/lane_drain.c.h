/*
 * The native lane's drain (part of lane.c, included by it: one translation unit, so
 * its helpers are lane.c's; `runtime.net.lane` hashes this file into the build's key).
 */
/* ---- the drain: records -> events, access-log lines, metric groups ---------------------- */
/*
 * `EventMaker(template, fields, bounds)` turns the records `add_record` appended into
 * what `NativeLane.drain` hands the observers (runtime/observe/batch.py `EventBatch`):
 *
 * - one `Event` per record: a copy of `template` (an Event with the PoP's pop, tier and
 *   geo, every other field its default) whose per-request fields are written through
 *   their member descriptors' offsets (`fields`: the names in FIELD order; checked to be
 *   plain object slots of the template's type), the same values the Python drain gave;
 * - with `lines`, the access log's lines of those events, byte for byte what
 *   `AccessLog.observe` writes: text (runtime/pipeline/stages/access_log.py TEXT_STR)
 *   or JSON (`AccessLog._json` as msgspec writes it);
 * - the records grouped by (route, status, method, refusal): their count, the count per
 *   verdict, body bytes, the duration histogram's buckets (`bounds`: bisect_left, the
 *   last one +Inf) and the durations in seconds, in order, for the histogram's sum.
 */
enum { F_TS, F_RID, F_CLIENT, F_BOT, F_METHOD, F_HOST, F_PATH, F_QUERY, F_STATUS, F_TARGET,
       F_OWNER, F_ROUTE, F_DECISIONS, F_STAGES, F_BYTES_IN, F_BYTES_OUT, F_DURATION,
       F_ERROR, N_FIELDS };
#define MAX_BOUNDS 31
#define TEXT_CACHE 4096  /* clients and hosts kept as text (NativeLane.texts) */

typedef struct {
    PyObject_HEAD
    PyObject *template, *copy;  /* the Event to copy, its type's __copy__ */
    PyObject *methods[N_METHODS];  /* METHOD_NAMES as str */
    Py_ssize_t offset[N_FIELDS];
    double bounds[MAX_BOUNDS];
    int n_bounds;
    long long second;  /* the second `stamp` renders (-1: none yet) */
    char stamp[32];
    size_t stamp_len;
} EventMaker;

static int EventMaker_init(EventMaker *m, PyObject *args, PyObject *kw) {
    (void)kw;
    PyObject *template, *fields, *bounds;
    if (!PyArg_ParseTuple(args, "OO!O!", &template, &PyTuple_Type, &fields, &PyTuple_Type,
                          &bounds))
        return -1;
    if (PyTuple_GET_SIZE(fields) != N_FIELDS || PyTuple_GET_SIZE(bounds) > MAX_BOUNDS) {
        PyErr_Format(PyExc_ValueError, "EventMaker: %d fields, at most %d bounds", N_FIELDS,
                     MAX_BOUNDS);
        return -1;
    }
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d = PyObject_GetAttr((PyObject *)Py_TYPE(template), PyTuple_GET_ITEM(fields, i));
        if (!d) return -1;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)d)->d_member->type == Py_T_OBJECT_EX &&
                 !(((PyMemberDescrObject *)d)->d_member->flags & Py_READONLY);
        if (ok) m->offset[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok) {
            PyErr_Format(PyExc_RuntimeError, "EventMaker: %R is not a writable object slot",
                         PyTuple_GET_ITEM(fields, i));
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(bounds); i++) {
        m->bounds[i] = PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i));
        if (m->bounds[i] == -1.0 && PyErr_Occurred()) return -1;
    }
    m->n_bounds = (int)PyTuple_GET_SIZE(bounds);
    Py_XSETREF(m->template, Py_NewRef(template));
    Py_XSETREF(m->copy, PyObject_GetAttrString((PyObject *)Py_TYPE(template), "__copy__"));
    for (int i = 0; i < N_METHODS; i++) {
        Py_XSETREF(m->methods[i], PyUnicode_InternFromString(METHOD_NAMES[i]));
        if (!m->methods[i]) return -1;
    }
    m->second = -1;
    return m->copy ? 0 : -1;
}

/* Write `value` (a new reference, may be NULL: then -1) into `obj`'s slot `field`. */
static int put(EventMaker *m, PyObject *obj, int field, PyObject *value) {
    if (!value) return -1;
    PyObject **slot = (PyObject **)((char *)obj + m->offset[field]);
    Py_XSETREF(*slot, value);
    return 0;
}

/* texts[key], or `make()` kept there (the table cleared past TEXT_CACHE): a borrowed
 * reference, NULL with a Python error. */
static PyObject *text_of(PyObject *texts, PyObject *key, PyObject *(*make)(PyObject *)) {
    PyObject *t = PyDict_GetItemWithError(texts, key);
    if (t || PyErr_Occurred()) return t;
    PyObject *made = make(key);
    if (!made) return NULL;
    if (PyDict_GET_SIZE(texts) >= TEXT_CACHE) PyDict_Clear(texts);
    int err = PyDict_SetItem(texts, key, made);
    Py_DECREF(made);  /* the dict holds it */
    return err ? NULL : made;
}

/* "ip:port" -> "ip" (Python's `client.rpartition(":")[0] or client`) */
static PyObject *client_ip(PyObject *client) {
    Py_ssize_t at = PyUnicode_FindChar(client, ':', 0, PyUnicode_GET_LENGTH(client), -1);
    if (at == -2) return NULL;
    if (at <= 0) return Py_NewRef(client);
    return PyUnicode_Substring(client, 0, at);
}

static PyObject *host_text(PyObject *host) {
    return PyUnicode_DecodeLatin1(PyBytes_AS_STRING(host), PyBytes_GET_SIZE(host), NULL);
}

/* ---- a growable byte buffer: the access-log lines ---- */
typedef struct { char *p; size_t len, cap; } buf_t;

static int reserve(buf_t *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p;
    b->cap = cap;
    return 0;
}

/* `s` encoded as `.encode("latin-1", "replace")` does: one '?' per code point past 255 */
static int put_latin1(buf_t *b, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (reserve(b, (size_t)n)) return -1;
    if (PyUnicode_KIND(s) == PyUnicode_1BYTE_KIND) {
        memcpy(b->p + b->len, PyUnicode_1BYTE_DATA(s), (size_t)n);
    } else {
        int kind = PyUnicode_KIND(s);
        const void *data = PyUnicode_DATA(s);
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            b->p[b->len + (size_t)i] = c > 255 ? '?' : (char)c;
        }
    }
    b->len += (size_t)n;
    return 0;
}

#define LIT(s_) (memcpy(b->p + b->len, s_, sizeof s_ - 1), b->len += sizeof s_ - 1)

/* The access log's text line of one event (access_log.TEXT_STR):
 * ts=%s.%03dZ method=%s path=%s status=%d fn=%s dur_ms=%.3f bytes=%d rid=%s client=%s
 * `micros` is round(took / 1000): dur_ms (micros / 1000, a double) printed with %.3f is
 * micros' digits with the point three from the right. */
/* m->stamp: the second `ts` falls in, as the access log renders it; -1 with an error. */
static int stamp_of(EventMaker *m, double ts) {
    long long second = (long long)ts;
    if (second != m->second) {
        time_t t = (time_t)second;
        struct tm tm;
        if (!gmtime_r(&t, &tm) ||
                !(m->stamp_len = strftime(m->stamp, sizeof m->stamp, "%Y-%m-%dT%H:%M:%S", &tm))) {
            PyErr_SetString(PyExc_ValueError, "access log: a time gmtime cannot render");
            return -1;
        }
        m->second = second;
    }
    return 0;
}

/* `ts` as the access log writes it, reserved for: its second's stamp, "." and its
 * milliseconds (Python's %03d of ts % 1 * 1000). */
static void put_ts(EventMaker *m, buf_t *b, double ts) {
    int millis = (int)(fmod(ts, 1.0) * 1000);
    memcpy(b->p + b->len, m->stamp, m->stamp_len);
    char *o = b->p + b->len + m->stamp_len;
    *o++ = '.';
    *o++ = (char)('0' + millis / 100);
    *o++ = (char)('0' + millis / 10 % 10);
    *o++ = (char)('0' + millis % 10);
    b->len = (size_t)(o - b->p);
}

static int put_line(EventMaker *m, buf_t *b, double ts, PyObject *method, PyObject *path,
                    long status, PyObject *target, unsigned long long micros,
                    unsigned long long size, const char *rid, size_t rid_len,
                    PyObject *client) {
    if (stamp_of(m, ts) || reserve(b, 160 + m->stamp_len)) return -1;
    LIT("ts=");
    put_ts(m, b, ts);
    LIT("Z method=");
    if (put_latin1(b, method) || reserve(b, 8)) return -1;
    LIT(" path=");
    if (put_latin1(b, path) || reserve(b, 40)) return -1;
    LIT(" status=");
    b->len = (size_t)(put_u64(b->p + b->len, (unsigned long long)status) - b->p);
    LIT(" fn=");
    if (target != Py_None ? put_latin1(b, target) : (reserve(b, 1) ? -1 : (LIT("-"), 0)))
        return -1;
    if (reserve(b, 100)) return -1;
    LIT(" dur_ms=");
    char *o = put_u64(b->p + b->len, micros / 1000);
    *o++ = '.';
    *o++ = (char)('0' + micros % 1000 / 100);
    *o++ = (char)('0' + micros % 100 / 10);
    *o++ = (char)('0' + micros % 10);
    b->len = (size_t)(o - b->p);
    LIT(" bytes=");
    b->len = (size_t)(put_u64(b->p + b->len, size) - b->p);
    LIT(" rid=");  /* never empty: "prefix-number" */
    if (reserve(b, rid_len + 9)) return -1;
    memcpy(b->p + b->len, rid, rid_len);
    b->len += rid_len;
    LIT(" client=");
    if (put_latin1(b, client) || reserve(b, 1)) return -1;
    LIT("\n");
    return 0;
}

/* `s` as msgspec writes a str in JSON: quoted; `"` and `\` escaped, control characters
 * as \b \t \n \f \r or \u00xx, the rest UTF-8 (DEL and U+2028 as they are). */
static int put_json_str(buf_t *b, PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (reserve(b, (size_t)n * 6 + 2)) return -1;
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    char *o = b->p + b->len;
    *o++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c == '"' || c == '\\') {
            *o++ = '\\';
            *o++ = (char)c;
        } else if (c < 0x20) {
            static const char SHORT[32] = {[8] = 'b', [9] = 't', [10] = 'n', [12] = 'f',
                                           [13] = 'r'};
            *o++ = '\\';
            if (SHORT[c]) {
                *o++ = SHORT[c];
            } else {
                static const char HEX[] = "0123456789abcdef";
                memcpy(o, "u00", 3);
                o[3] = HEX[c >> 4];
                o[4] = HEX[c & 15];
                o += 5;
            }
        } else if (c < 0x80) {
            *o++ = (char)c;
        } else if (c < 0x800) {
            *o++ = (char)(0xc0 | (c >> 6));
            *o++ = (char)(0x80 | (c & 0x3f));
        } else if (c < 0x10000) {
            if (c >= 0xd800 && c <= 0xdfff) {  /* a lone surrogate: msgspec refuses it */
                PyErr_SetString(PyExc_UnicodeEncodeError, "access log: a lone surrogate");
                return -1;
            }
            *o++ = (char)(0xe0 | (c >> 12));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3f));
            *o++ = (char)(0x80 | (c & 0x3f));
        } else {
            *o++ = (char)(0xf0 | (c >> 18));
            *o++ = (char)(0x80 | ((c >> 12) & 0x3f));
            *o++ = (char)(0x80 | ((c >> 6) & 0x3f));
            *o++ = (char)(0x80 | (c & 0x3f));
        }
    }
    *o++ = '"';
    b->len = (size_t)(o - b->p);
    return 0;
}

/* The access log's JSON line of one event (`AccessLog._json`, as msgspec writes it):
 * {"ts":"<stamp>.<ms>Z","method":..,"path":..,"status":..,"fn":..,"dur_ms":..,
 *  "bytes":..,"rid":..,"client":..,"stages":{}} -- the lane's requests are not timed
 * stage by stage. dur_ms is round(micros / 1000, 3) in the shortest form that reads
 * back as that float: micros' digits with the point three from the right, its trailing
 * zeros dropped but one ("2.0", "1.5", "0.001"). */
static int put_json_line(EventMaker *m, buf_t *b, double ts, PyObject *method, PyObject *path,
                         long status, PyObject *target, unsigned long long micros,
                         unsigned long long size, const char *rid, size_t rid_len,
                         PyObject *client) {
    if (stamp_of(m, ts) || reserve(b, 64 + m->stamp_len)) return -1;
    LIT("{\"ts\":\"");
    put_ts(m, b, ts);
    LIT("Z\",\"method\":");
    if (put_json_str(b, method) || reserve(b, 16)) return -1;
    LIT(",\"path\":");
    if (put_json_str(b, path) || reserve(b, 48)) return -1;
    LIT(",\"status\":");
    b->len = (size_t)(put_u64(b->p + b->len, (unsigned long long)status) - b->p);
    LIT(",\"fn\":");
    if (target != Py_None ? put_json_str(b, target) : (reserve(b, 3) ? -1 : (LIT("\"-\""), 0)))
        return -1;
    if (reserve(b, 96 + rid_len * 6)) return -1;
    LIT(",\"dur_ms\":");
    char *o = put_u64(b->p + b->len, micros / 1000);
    *o++ = '.';
    unsigned frac = (unsigned)(micros % 1000);
    *o++ = (char)('0' + frac / 100);
    if (frac % 100) *o++ = (char)('0' + frac / 10 % 10);
    if (frac % 10) *o++ = (char)('0' + frac % 10);
    b->len = (size_t)(o - b->p);
    LIT(",\"bytes\":");
    b->len = (size_t)(put_u64(b->p + b->len, size) - b->p);
    LIT(",\"rid\":\"");  /* a request id: token characters, nothing JSON escapes */
    memcpy(b->p + b->len, rid, rid_len);
    b->len += rid_len;
    LIT("\",\"client\":");
    if (put_json_str(b, client) || reserve(b, 16)) return -1;
    LIT(",\"stages\":{}}\n");
    return 0;
}

/* ---- groups: records of one (route, status, method) ---- */
#define MAX_VERDICTS 256  /* runtime/pipeline/lane.py's */
/* a route's flags in `make`'s routes: http_cache counts its GETs' MISS (`_first`);
 * ratelimit passed its requests (its decision in their events) */
enum { ROUTE_MISS = 1, ROUTE_PASSED = 2 };
typedef struct {
    long route, status, method, n;
    PyObject *refused;  /* its records' (borrowed from them): None, or a refusal's pair */
    long long bytes;
    long buckets[MAX_BOUNDS + 1];
    long verdicts[MAX_VERDICTS];  /* records per verdict */
    PyObject *durations;  /* list of seconds, in order */
} group_t;

static void free_groups(group_t *g, size_t n) {
    for (size_t i = 0; i < n; i++) Py_XDECREF(g[i].durations);
    free(g);
}

/* The group of (route, status, method, refused) in `*gs` (made if new), NULL with a
 * Python error. */
static group_t *group_of(group_t **gs, size_t *n, size_t *cap, long route, long status,
                         long method, PyObject *refused) {
    for (size_t i = *n; i-- > 0;)
        if ((*gs)[i].route == route && (*gs)[i].status == status &&
                (*gs)[i].method == method && (*gs)[i].refused == refused)
            return &(*gs)[i];
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 4;
        group_t *p = realloc(*gs, c * sizeof *p);
        if (!p) { PyErr_NoMemory(); return NULL; }
        *gs = p;
        *cap = c;
    }
    group_t *g = &(*gs)[(*n)++];
    memset(g, 0, sizeof *g);
    g->route = route;
    g->status = status;
    g->method = method;
    g->refused = refused;
    g->durations = PyList_New(0);
    return g->durations ? g : NULL;
}

static PyObject *groups_out(EventMaker *m, group_t *gs, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        group_t *g = &gs[i];
        PyObject *buckets = PyList_New(0);
        for (int b = 0; buckets && b <= m->n_bounds; b++) {
            if (!g->buckets[b]) continue;
            PyObject *pair = Py_BuildValue("(il)", b, g->buckets[b]);
            if (!pair || PyList_Append(buckets, pair)) Py_CLEAR(buckets);
            Py_XDECREF(pair);
        }
        PyObject *verdicts = buckets ? PyDict_New() : NULL;
        for (int v = 0; verdicts && v < MAX_VERDICTS; v++) {
            if (!g->verdicts[v]) continue;
            PyObject *k = PyLong_FromLong(v), *c = PyLong_FromLong(g->verdicts[v]);
            if (!k || !c || PyDict_SetItem(verdicts, k, c)) Py_CLEAR(verdicts);
            Py_XDECREF(k);
            Py_XDECREF(c);
        }
        PyObject *t = verdicts ? Py_BuildValue("(lllllNNOO)", g->route, g->status, g->method,
                                               g->n, (long)g->bytes, verdicts, buckets,
                                               g->durations, g->refused) : NULL;
        if (!verdicts) Py_XDECREF(buckets);
        if (!t) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyObject *latin1(const char *s, size_t n) {
    return PyUnicode_DecodeLatin1(s, (Py_ssize_t)n, NULL);
}

/* The Event of record `r` (its route's and verdict's texts given): a copy of the
 * template with the per-request fields written. NULL with a Python error. */
static PyObject *make_event(EventMaker *m, const view_t *r, PyObject *route, PyObject *v,
                            PyObject *decisions, PyObject *method, PyObject *host,
                            PyObject *path, PyObject *client, const char *id, size_t id_len,
                            double duration_ms, PyObject *error) {
    PyObject *e = PyObject_Vectorcall(m->copy, &m->template, 1, NULL);
    if (!e || put(m, e, F_TS, PyFloat_FromDouble(r->ts)) ||
            put(m, e, F_RID, PyUnicode_FromStringAndSize(id, (Py_ssize_t)id_len)) ||
            put(m, e, F_CLIENT, Py_NewRef(client)) ||
            put(m, e, F_BOT, Py_NewRef(PyTuple_GET_ITEM(v, 0))) ||
            put(m, e, F_METHOD, Py_NewRef(method)) || put(m, e, F_HOST, Py_NewRef(host)) ||
            put(m, e, F_PATH, Py_NewRef(path)) ||
            (r->query_len && put(m, e, F_QUERY, latin1(r->query, r->query_len))) ||
            put(m, e, F_STATUS, PyLong_FromLong(r->status)) ||
            put(m, e, F_TARGET, Py_NewRef(PyTuple_GET_ITEM(route, 1))) ||
            put(m, e, F_OWNER, Py_NewRef(PyTuple_GET_ITEM(route, 2))) ||
            put(m, e, F_ROUTE, Py_NewRef(PyTuple_GET_ITEM(route, 3))) ||
            put(m, e, F_DECISIONS, PyDict_Copy(decisions)) ||
            put(m, e, F_STAGES, PyDict_New()) ||
            put(m, e, F_BYTES_IN, PyLong_FromUnsignedLongLong(r->bytes_in)) ||
            put(m, e, F_BYTES_OUT, PyLong_FromUnsignedLongLong(r->size)) ||
            put(m, e, F_DURATION, PyFloat_FromDouble(duration_ms)) ||
            (error && put(m, e, F_ERROR, Py_NewRef(error)))) {
        Py_XDECREF(e);
        return NULL;
    }
    return e;
}

/* `host` as a cache key holds it (runtime/cache/http/cache.py `origin_host`): lower
 * case, without ":80" and trailing dots. A new reference, NULL with a Python error. */
static PyObject *origin_host(PyObject *host) {
    PyObject *h = PyObject_CallMethod(host, "lower", NULL);
    if (!h) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(h);
    if (n >= 3 && PyUnicode_READ_CHAR(h, n - 3) == ':' && PyUnicode_READ_CHAR(h, n - 2) == '8'
            && PyUnicode_READ_CHAR(h, n - 1) == '0') {
        Py_SETREF(h, PyUnicode_Substring(h, 0, n - 3));
        if (!h) return NULL;
        n -= 3;
    }
    Py_ssize_t end = n;
    while (end > 0 && PyUnicode_READ_CHAR(h, end - 1) == '.') end--;
    if (end < n && end > 0) Py_SETREF(h, PyUnicode_Substring(h, 0, end));
    else if (end < n) Py_SETREF(h, PyUnicode_FromString("."));
    return h;
}

/* `base` (a verdict's decisions) with http_cache's record of a bypassed request (an
 * unsafe method): {"outcome": "BYPASS", "key": "<label> <host><path>[?<query>]"}, as
 * `HttpCacheStage._record` makes it (`_label` of the key). A new dict, NULL with a
 * Python error. */
static PyObject *bypass_decisions(PyObject *base, PyObject *label, PyObject *host,
                                  PyObject *path, const char *query, size_t query_len) {
    PyObject *origin = origin_host(host);
    if (!origin) return NULL;
    PyObject *key = PyUnicode_FromFormat(query_len ? "%U %U%U?%s" : "%U %U%U%s",
                                         label, origin, path, "");
    Py_DECREF(origin);
    if (key && query_len) {
        PyObject *q = latin1(query, query_len);
        Py_SETREF(key, q ? PyUnicode_Concat(key, q) : NULL);
        Py_XDECREF(q);
    }
    PyObject *record = key ? Py_BuildValue("{s:s,s:N}", "outcome", "BYPASS", "key", key) : NULL;
    PyObject *d = record ? PyDict_Copy(base) : NULL;
    if (d && PyDict_SetItemString(d, "http_cache", record)) Py_CLEAR(d);
    Py_XDECREF(record);
    return d;
}

/* One record's event into `*event` (a new reference; `event` NULL: none, the ring
 * keeps the records), its line in `log` (when given) and its share of its group. 0, or
 * -1 with a Python error. */
static int make_one(EventMaker *m, const view_t *r, PyObject *routes, PyObject *verdicts,
                    PyObject *texts, const char *prefix, size_t prefix_len, buf_t *log,
                    int json, group_t **gs, size_t *ng, size_t *cap, size_t *max_text,
                    PyObject **event) {
    long ri = r->ri, verdict = r->verdict, method = r->method, status = r->status;
    if (ri < 0 || ri >= PyTuple_GET_SIZE(routes) || verdict < 0 || verdict >= MAX_VERDICTS ||
            method < 0 || method >= N_METHODS || verdict >= PyTuple_GET_SIZE(verdicts) ||
            r->kept_len > 128) {
        PyErr_SetString(PyExc_ValueError, "a record names no route or verdict, or is mistyped");
        return -1;
    }
    /* route: (path, target, owner, route, flags: ROUTE_MISS, ROUTE_PASSED); verdict:
     * (class, decisions, with MISS[, with ratelimit's pass, with both]) */
    PyObject *route = PyTuple_GET_ITEM(routes, ri), *v = PyTuple_GET_ITEM(verdicts, verdict);
    long flags = PyTuple_Check(route) && PyTuple_GET_SIZE(route) == 5
                     ? PyLong_AsLong(PyTuple_GET_ITEM(route, 4)) : -1;
    Py_ssize_t sized = PyTuple_Check(v) ? PyTuple_GET_SIZE(v) : 0;
    if (flags < 0 || flags > 3 || !(sized == 5 || (sized == 3 && !(flags & ROUTE_PASSED)))) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "routes: 5-tuples ending in flags 0..3; verdicts: "
                            "3-tuples, 5 for a route ratelimit passes");
        }
        return -1;
    }
    /* a refused request's: the verdict's decisions updated with the refusal's (ratelimit's
     * record added, or bots' replaced), nothing of http_cache (not reached) */
    PyObject *refused = r->refused;
    int first = (flags & ROUTE_MISS) != 0 && !refused;
    PyObject *decisions = PyTuple_GET_ITEM(v, refused ? 1 : (first && method < MC_POST ? 2 : 1) +
                                                  (flags & ROUTE_PASSED ? 2 : 0));
    PyObject *client = text_of(texts, r->client, client_ip);
    PyObject *host = client ? text_of(texts, r->host, host_text) : NULL;
    if (!client || !host || !PyDict_Check(decisions)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "decisions: a dict");
        return -1;
    }
    /* the request's path: its route's own, or one under it (latin-1, as the front's) */
    PyObject *path = r->path ? latin1(r->path, r->path_len)
                             : Py_NewRef(PyTuple_GET_ITEM(route, 0));
    if (!path) return -1;
    PyObject *bypass = NULL;  /* an unsafe method's, where http_cache counts: `_record`'s;
                               * a refusal's */
    if (refused && event) {
        bypass = PyDict_Copy(decisions);
        if (!bypass || PyDict_Update(bypass, PyTuple_GET_ITEM(refused, 0))) {
            Py_XDECREF(bypass);
            Py_DECREF(path);
            return -1;
        }
        decisions = bypass;
    } else if (first && method >= MC_POST && event) {
        bypass = bypass_decisions(decisions, PyTuple_GET_ITEM(route, 1), host, path, r->query,
                                  r->query_len);
        if (!bypass) { Py_DECREF(path); return -1; }
        decisions = bypass;
    }
    double micros = nearbyint((double)r->took / 1000.0);  /* Python's round(): half to even */
    double duration_ms = micros / 1000.0;                  /* round(took / 1000) / 1000 */
    PyObject *method_text = m->methods[method];
    char id[160];  /* the caller's, or f"{prefix}-{number:x}" */
    size_t id_len;
    if (r->kept) {
        id_len = r->kept_len;
        memcpy(id, r->kept, id_len);
    } else {
        memcpy(id, prefix, prefix_len);
        id[prefix_len] = '-';
        id_len = (size_t)(put_hex(id + prefix_len + 1, r->number) - id);
    }
    if (log && (json ? put_json_line : put_line)(m, log, r->ts, method_text, path, status,
                                                 PyTuple_GET_ITEM(route, 1),
                                                 (unsigned long long)micros, r->size, id,
                                                 id_len, client)) {
        Py_XDECREF(bypass);
        Py_DECREF(path);
        return -1;
    }
    PyObject *e = !event ? NULL
                         : make_event(m, r, route, v, decisions, method_text, host, path,
                                      client, id, id_len, duration_ms,
                                      refused ? PyTuple_GET_ITEM(refused, 1) : NULL);
    Py_XDECREF(bypass);
    size_t text = (size_t)PyUnicode_GET_LENGTH(path) + r->query_len +
                  (size_t)PyUnicode_GET_LENGTH(host);
    Py_DECREF(path);
    if (event && !e) return -1;
    group_t *g = group_of(gs, ng, cap, ri, status, method, refused ? refused : Py_None);
    double seconds = duration_ms / 1000;
    int b = 0;
    while (b < m->n_bounds && m->bounds[b] < seconds) b++;  /* bisect_left */
    PyObject *s = g ? PyFloat_FromDouble(seconds) : NULL;
    int err = !s || PyList_Append(g->durations, s);
    Py_XDECREF(s);
    if (err) { Py_XDECREF(e); return -1; }
    g->n++;
    g->bytes += (long long)r->size;
    g->buckets[b]++;
    g->verdicts[verdict]++;
    if (text > *max_text) *max_text = text;
    if (event) *event = e;
    return 0;
}

/* make(records, routes, verdicts, texts, prefix, lines[, ctx]) -> (events, lines, groups,
 * text): `records` a `Records`, or a list of the tuples it reads as; `routes[i]` (path,
 * target, owner, route, flags: ROUTE_MISS, http_cache's `_first`; ROUTE_PASSED,
 * ratelimit's), `verdicts[i]` (bot class, decisions, decisions with the MISS[, with
 * ratelimit's pass, with both]), `texts` the dict of clients' and hosts' texts it keeps,
 * `prefix` the request ids' (str), `lines` which access-log lines to write: 0 (or
 * False) none (None), 1 (True) text, 2 JSON. With `ctx` (not None; a `Records` only:
 * TypeError with a list), no Event is made: `events` is None (the ring keeps the
 * `Records`, and makes each event when it is read). Groups: (route, status,
 * method, n, bytes, {verdict: n}, [(bucket, n)], [seconds], refused: None or the
 * refusal's pair its records share); `text` the most characters of path, query and
 * host together in one event. */
static PyObject *EventMaker_make(EventMaker *m, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs < 6 || nargs > 7 || !(PyList_Check(a[0]) || is_records(a[0])) ||
            !PyTuple_Check(a[1]) || !PyTuple_Check(a[2]) || !PyDict_Check(a[3]) ||
            !PyUnicode_Check(a[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "make(records, routes, verdicts, texts, prefix, lines[, ctx])");
        return NULL;
    }
    Records *packed = is_records(a[0]) ? (Records *)a[0] : NULL;
    int later = nargs == 7 && a[6] != Py_None;  /* made when read: no event now */
    if (later && !packed) {
        PyErr_SetString(PyExc_TypeError, "make: a ctx (events made when read) is for a "
                        "Records only");
        return NULL;
    }
    long want = PyLong_AsLong(a[5]);
    if (want < 0 || want > 2 || !m->template) {
        if (!PyErr_Occurred() && m->template)
            PyErr_SetString(PyExc_ValueError, "lines: 0 none, 1 text, 2 JSON");
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "EventMaker not initialised");
        return NULL;
    }
    Py_ssize_t prefix_len;
    const char *prefix = PyUnicode_AsUTF8AndSize(a[4], &prefix_len);
    if (!prefix) return NULL;
    if (prefix_len > 64) {
        PyErr_SetString(PyExc_ValueError, "a request id prefix past 64 bytes");
        return NULL;
    }
    Py_ssize_t n = packed ? packed->n : PyList_GET_SIZE(a[0]);
    size_t max_text = 0;
    /* the ring keeps a Records as it is: no event */
    PyObject *events = later ? Py_NewRef(Py_None) : PyList_New(n);
    buf_t log = {NULL, 0, 0};
    group_t *gs = NULL;
    size_t ng = 0, cap = 0;
    PyObject *out = NULL;
    for (Py_ssize_t i = 0; events && i < n; i++) {
        view_t v;
        if (packed) packed_view(packed, i, &v);
        else if (tuple_view(PyList_GET_ITEM(a[0], i), &v)) goto done;
        PyObject *e = NULL;
        if (make_one(m, &v, a[1], a[2], a[3], prefix, (size_t)prefix_len,
                     want ? &log : NULL, want == 2, &gs, &ng, &cap, &max_text,
                     events == Py_None ? NULL : &e))
            goto done;
        if (e) PyList_SET_ITEM(events, i, e);
    }
    if (events) {
        PyObject *groups = groups_out(m, gs, ng);
        PyObject *lines = !want ? Py_NewRef(Py_None)
                                : PyBytes_FromStringAndSize(log.p ? log.p : "", (Py_ssize_t)log.len);
        if (groups && lines) out = Py_BuildValue("(OOOn)", events, lines, groups,
                                                 (Py_ssize_t)max_text);
        Py_XDECREF(groups);
        Py_XDECREF(lines);
    }
done:
    Py_XDECREF(events);
    free(log.p);
    free_groups(gs, ng);
    return out;
}

static int EventMaker_traverse(EventMaker *m, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(m));
    Py_VISIT(m->template);
    Py_VISIT(m->copy);
    return 0;
}

static int EventMaker_clear(EventMaker *m) {
    Py_CLEAR(m->template);
    Py_CLEAR(m->copy);
    for (int i = 0; i < N_METHODS; i++) Py_CLEAR(m->methods[i]);
    return 0;
}

static void EventMaker_dealloc(EventMaker *m) {
    PyTypeObject *tp = Py_TYPE(m);
    PyObject_GC_UnTrack(m);
    EventMaker_clear(m);
    tp->tp_free((PyObject *)m);
    Py_DECREF(tp);
}

static PyMethodDef MAKER_METHODS[] = {
    {"make", (PyCFunction)(void (*)(void))EventMaker_make, METH_FASTCALL,
     "make(records, routes, verdicts, texts, prefix, lines[, ctx]) -> (events, lines, groups, text)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot MAKER_SLOTS[] = {
    {Py_tp_init, EventMaker_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, EventMaker_dealloc},
    {Py_tp_traverse, EventMaker_traverse},
    {Py_tp_clear, EventMaker_clear},
    {Py_tp_methods, MAKER_METHODS},
    {0, NULL}};

static PyType_Spec MAKER_SPEC = {"_edgefn_lane.EventMaker", sizeof(EventMaker), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, MAKER_SLOTS};
