/* The function ABI's hot paths (edgefn_core/abi.py) and the frame cutting of
 * edgefn_core/frames.py, as a CPython extension (`_edgefn_codec`), compiled on first
 * use by edgefn_core/fastcodec.py.
 *
 * The Python functions are the reference: each C function here answers only what it
 * is sure of (exact bytes, lists of (bytes, bytes), a well-formed buffer) and hands
 * everything else to its Python twin (`bind` gives them), which returns the same
 * result or raises the error it always raised. So an error's type and message are the
 * Python code's by construction; tests/test_fastcodec.py checks the results agree.
 *
 * Multi-phase init, no global state (the token table is a constant), per-interpreter
 * GIL supported: the isolate host's guests import it in their own interpreters. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ABI's u32s are copied as is");

#define MAX_HEAD_BYTES (64 << 10) /* edgefn_core.abi.MAX_HEAD_BYTES */
#define MAX_HEAD_FIELDS 4096      /* edgefn_core.abi.MAX_HEAD_FIELDS */
#define U32_MAX 0xffffffffULL

typedef struct {
    PyObject *encode_request, *decode_request, *encode_response, *decode_response;
    PyObject *guest_request; /* abi.GuestRequest */
    PyObject *names[4];      /* "status", "body", "headers", "_items" (`response_frame`) */
} codec_state;

static codec_state *state_of(PyObject *mod) { return (codec_state *)PyModule_GetState(mod); }

/* RFC 9110 token characters: abi.TOKEN */
#define T1(c) [c] = 1
static const unsigned char TCHAR[256] = {
    T1('!'), T1('#'), T1('$'), T1('%'), T1('&'), T1('\''), T1('*'), T1('+'), T1('-'), T1('.'),
    T1('^'), T1('_'), T1('`'), T1('|'), T1('~'),
    T1('0'), T1('1'), T1('2'), T1('3'), T1('4'), T1('5'), T1('6'), T1('7'), T1('8'), T1('9'),
    T1('A'), T1('B'), T1('C'), T1('D'), T1('E'), T1('F'), T1('G'), T1('H'), T1('I'), T1('J'),
    T1('K'), T1('L'), T1('M'), T1('N'), T1('O'), T1('P'), T1('Q'), T1('R'), T1('S'), T1('T'),
    T1('U'), T1('V'), T1('W'), T1('X'), T1('Y'), T1('Z'),
    T1('a'), T1('b'), T1('c'), T1('d'), T1('e'), T1('f'), T1('g'), T1('h'), T1('i'), T1('j'),
    T1('k'), T1('l'), T1('m'), T1('n'), T1('o'), T1('p'), T1('q'), T1('r'), T1('s'), T1('t'),
    T1('u'), T1('v'), T1('w'), T1('x'), T1('y'), T1('z'),
};

static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static char *put_u32(char *o, uint64_t v) { uint32_t w = (uint32_t)v; memcpy(o, &w, 4); return o + 4; }
static char *put_raw(char *o, PyObject *b) {
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    memcpy(o, PyBytes_AS_STRING(b), (size_t)n);
    return o + n;
}
static char *put_str(char *o, PyObject *b) {
    return put_raw(put_u32(o, (uint64_t)PyBytes_GET_SIZE(b)), b);
}

/* The Python twin's answer to the same call. */
static PyObject *fallback(PyObject *twin, PyObject *const *args, size_t nargsf, PyObject *kw) {
    if (!twin) {
        PyErr_SetString(PyExc_RuntimeError, "_edgefn_codec: bind() was not called");
        return NULL;
    }
    return PyObject_Vectorcall(twin, args, nargsf, kw);
}

/* Bytes of a pairs list if it is a list of 2-tuples of exact bytes, each under 4 GiB;
 * -1 if not (the twin then decides). */
static int64_t pairs_size(PyObject *pairs) {
    if (!PyList_CheckExact(pairs)) return -1;
    int64_t n = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pairs); i++) {
        PyObject *t = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2) return -1;
        PyObject *k = PyTuple_GET_ITEM(t, 0), *v = PyTuple_GET_ITEM(t, 1);
        if (!PyBytes_CheckExact(k) || !PyBytes_CheckExact(v)) return -1;
        if ((uint64_t)PyBytes_GET_SIZE(k) > U32_MAX || (uint64_t)PyBytes_GET_SIZE(v) > U32_MAX)
            return -1;
        n += 8 + PyBytes_GET_SIZE(k) + PyBytes_GET_SIZE(v);
    }
    return n;
}

static char *put_pairs(char *o, PyObject *pairs) {
    Py_ssize_t count = PyList_GET_SIZE(pairs);
    o = put_u32(o, (uint64_t)count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(pairs, i);
        o = put_str(put_str(o, PyTuple_GET_ITEM(t, 0)), PyTuple_GET_ITEM(t, 1));
    }
    return o;
}

/* ---- request ------------------------------------------------------------------------ */

/* encode_request(method, path, query, headers, env_blob, body, params_blob=NO_PAIRS,
 *                principal_blob=b"") -> bytes */
static PyObject *encode_request(PyObject *mod, PyObject *const *a, size_t nargsf, PyObject *kw) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kw || nargs < 6 || nargs > 8) goto twin;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        if (i == 3) continue;
        if (!PyBytes_CheckExact(a[i])) goto twin;
        if ((i < 3 || i == 5) && (uint64_t)PyBytes_GET_SIZE(a[i]) > U32_MAX) goto twin;
    }
    int64_t heads = pairs_size(a[3]);
    if (heads < 0 || (uint64_t)PyList_GET_SIZE(a[3]) > U32_MAX) goto twin;
    int64_t size = 4 + 4 * 5 + heads;
    for (Py_ssize_t i = 0; i < nargs; i++) if (i != 3) size += PyBytes_GET_SIZE(a[i]);
    if (nargs < 7) size += 4; /* NO_PAIRS */
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out) return NULL;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, "EFQ1", 4);
    o = put_str(put_str(put_str(o + 4, a[0]), a[1]), a[2]);
    o = put_pairs(o, a[3]);
    o = put_str(put_raw(o, a[4]), a[5]);
    if (nargs > 6) o = put_raw(o, a[6]);
    else o = put_u32(o, 0);
    if (nargs > 7) o = put_raw(o, a[7]);
    return out;
twin:
    return fallback(state_of(mod)->encode_request, a, nargsf, kw);
}

/* A walk over a buffer: every read checked; `ok` turns 0 at the first that does not fit. */
typedef struct { const uint8_t *p; uint64_t len, pos; int ok; } cursor;

static uint32_t take_u32(cursor *c) {
    if (!c->ok || c->len - c->pos < 4) { c->ok = 0; return 0; }
    uint32_t v = get_u32(c->p + c->pos);
    c->pos += 4;
    return v;
}

/* The next string as bytes; NULL with c->ok == 0 if it does not fit (no exception),
 * NULL with an exception on MemoryError. */
static PyObject *take_str(cursor *c) {
    uint32_t n = take_u32(c);
    if (!c->ok || n > c->len - c->pos) { c->ok = 0; return NULL; }
    PyObject *s = PyBytes_FromStringAndSize((const char *)c->p + c->pos, n);
    c->pos += n;
    return s;
}

static PyObject *take_pairs(cursor *c) {
    uint32_t count = take_u32(c);
    /* each pair takes at least 8 bytes: a huge count fails before any allocation */
    if (!c->ok || (uint64_t)count * 8 > c->len - c->pos) { c->ok = 0; return NULL; }
    PyObject *list = PyList_New(count);
    if (!list) return NULL;
    for (uint32_t i = 0; i < count; i++) {
        PyObject *k = take_str(c);
        PyObject *v = k ? take_str(c) : NULL;
        PyObject *t = v ? PyTuple_New(2) : NULL;
        if (!t) { Py_XDECREF(k); Py_XDECREF(v); Py_DECREF(list); return NULL; }
        PyTuple_SET_ITEM(t, 0, k);
        PyTuple_SET_ITEM(t, 1, v);
        PyList_SET_ITEM(list, i, t);
    }
    return list;
}

/* decode_request(buf) -> GuestRequest */
static PyObject *decode_request(PyObject *mod, PyObject *const *a, size_t nargsf, PyObject *kw) {
    codec_state *st = state_of(mod);
    if (kw || PyVectorcall_NARGS(nargsf) != 1 || !PyBytes_CheckExact(a[0]) || !st->guest_request)
        return fallback(st->decode_request, a, nargsf, kw);
    cursor c = {(const uint8_t *)PyBytes_AS_STRING(a[0]), (uint64_t)PyBytes_GET_SIZE(a[0]), 4, 1};
    if (c.len < 4 || memcmp(c.p, "EFQ1", 4) != 0) return fallback(st->decode_request, a, nargsf, kw);
    PyObject *f[8] = {NULL};
    int i = 0;
    for (; i < 6; i++) {  /* method path query headers env body */
        f[i] = (i == 3 || i == 4) ? take_pairs(&c) : take_str(&c);
        if (!f[i]) goto fail;
    }
    for (; i < 8; i++) {  /* params, principal: absent from an older PoP's request */
        f[i] = c.pos < c.len ? take_pairs(&c) : PyList_New(0);
        if (!f[i]) goto fail;
    }
    /* GuestRequest._make(f): what tuple.__new__ does for a subclass, without the
     * intermediate tuple (PyType_GenericAlloc tracks it; no allocation runs before
     * every item is set) */
    PyTypeObject *type = (PyTypeObject *)st->guest_request;
    PyObject *out = type->tp_alloc(type, 8);
    if (!out) goto fail;
    for (i = 0; i < 8; i++) PyTuple_SET_ITEM(out, i, f[i]);
    return out;
fail:
    for (int j = 0; j < 8; j++) Py_XDECREF(f[j]);
    if (PyErr_Occurred()) return NULL;
    return fallback(st->decode_request, a, nargsf, kw);
}

/* ---- response ----------------------------------------------------------------------- */

/* encode_response(status, headers, body) -> bytes */
static PyObject *encode_response(PyObject *mod, PyObject *const *a, size_t nargsf, PyObject *kw) {
    if (kw || PyVectorcall_NARGS(nargsf) != 3 || !PyLong_CheckExact(a[0]) ||
            !PyBytes_CheckExact(a[2]) || (uint64_t)PyBytes_GET_SIZE(a[2]) > U32_MAX)
        goto twin;
    int overflow = 0;
    long long status = PyLong_AsLongLongAndOverflow(a[0], &overflow);
    if (overflow || status < 0 || (unsigned long long)status > U32_MAX) goto twin;
    int64_t heads = pairs_size(a[1]);
    if (heads < 0 || (uint64_t)PyList_GET_SIZE(a[1]) > U32_MAX) goto twin;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 12 + heads + PyBytes_GET_SIZE(a[2]));
    if (!out) return NULL;
    char *o = put_u32(PyBytes_AS_STRING(out), (uint64_t)status);
    put_str(put_pairs(o, a[1]), a[2]);
    return out;
twin:
    return fallback(state_of(mod)->encode_response, a, nargsf, kw);
}

/* (status, [(name.lower(), value)], body), or NULL without an exception when the
 * buffer is malformed, a header invalid, a status not final or the head too large:
 * the twin then raises the error that says which. */
static PyObject *decode_response_buf(const uint8_t *p, uint64_t len) {
    if (len < 8) return NULL;
    uint32_t status = get_u32(p), count = get_u32(p + 4);
    if (status < 200 || status > 599 || count > MAX_HEAD_FIELDS ||
            (uint64_t)count * 8 > len - 8)
        return NULL;
    PyObject *headers = PyList_New(count);
    if (!headers) return NULL;
    uint64_t pos = 8, head = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (len - pos < 4) goto bad;
        uint32_t n = get_u32(p + pos);
        if (n == 0 || n > len - pos - 4) goto bad;
        const uint8_t *name = p + pos + 4;
        pos += 4 + (uint64_t)n;
        if (len - pos < 4) goto bad;
        uint32_t m = get_u32(p + pos);
        if (m > len - pos - 4) goto bad;
        const uint8_t *value = p + pos + 4;
        pos += 4 + (uint64_t)m;
        head += (uint64_t)n + m;
        if (head > MAX_HEAD_BYTES) goto bad;
        for (uint32_t j = 0; j < n; j++) if (!TCHAR[name[j]]) goto bad;
        for (uint32_t j = 0; j < m; j++)
            if ((value[j] < 0x20 && value[j] != '\t') || value[j] == 0x7f) goto bad;
        PyObject *k = PyBytes_FromStringAndSize(NULL, n);
        PyObject *v = k ? PyBytes_FromStringAndSize((const char *)value, m) : NULL;
        PyObject *t = v ? PyTuple_New(2) : NULL;
        if (!t) { Py_XDECREF(k); Py_XDECREF(v); goto bad; }
        char *lower = PyBytes_AS_STRING(k);
        for (uint32_t j = 0; j < n; j++)
            lower[j] = (char)(name[j] >= 'A' && name[j] <= 'Z' ? name[j] + 32 : name[j]);
        PyTuple_SET_ITEM(t, 0, k);
        PyTuple_SET_ITEM(t, 1, v);
        PyList_SET_ITEM(headers, i, t);
    }
    if (len - pos < 4) goto bad;
    uint32_t nb = get_u32(p + pos);
    if (nb > len - pos - 4) goto bad;
    PyObject *body = PyBytes_FromStringAndSize((const char *)p + pos + 4, nb);
    if (!body) goto bad;
    return Py_BuildValue("(INN)", status, headers, body);
bad:
    Py_DECREF(headers);
    return NULL;
}

/* decode_response(buf) -> (status, headers, body) */
static PyObject *decode_response(PyObject *mod, PyObject *const *a, size_t nargsf, PyObject *kw) {
    if (!kw && PyVectorcall_NARGS(nargsf) == 1 && PyBytes_CheckExact(a[0])) {
        PyObject *out = decode_response_buf((const uint8_t *)PyBytes_AS_STRING(a[0]),
                                            (uint64_t)PyBytes_GET_SIZE(a[0]));
        if (out || PyErr_Occurred()) return out;
    }
    return fallback(state_of(mod)->decode_response, a, nargsf, kw);
}

/* ---- frames ------------------------------------------------------------------------- */

/* cut_frames(buf, big_endian, min_size, max_size, kinds) -> (frames, end, bad)
 * The complete frames of `buf` (a u32 length, then that many bytes) as FrameReader.feed
 * cuts them: bodies as bytes, or with `kinds` (a list of 256 one-byte bytes), (kind,
 * rest) pairs; `end`: where the first incomplete frame starts; `bad`: a length outside
 * [min_size, max_size] where the cutting stopped (the caller raises), else -1. */
static PyObject *cut_frames(PyObject *mod, PyObject *const *a, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "cut_frames() takes 5 arguments");
        return NULL;
    }
    int big = PyObject_IsTrue(a[1]);
    unsigned long long lo = PyLong_AsUnsignedLongLong(a[2]), hi = PyLong_AsUnsignedLongLong(a[3]);
    if (big < 0 || PyErr_Occurred()) return NULL;
    PyObject *kinds = a[4] == Py_None ? NULL : a[4];
    if (kinds && (!PyList_CheckExact(kinds) || PyList_GET_SIZE(kinds) != 256)) {
        PyErr_SetString(PyExc_TypeError, "kinds must be a list of 256 bytes");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(a[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *p = view.buf;
    uint64_t len = (uint64_t)view.len, pos = 0;
    long long bad = -1;
    PyObject *out = PyList_New(0);
    if (!out) goto done;
    while (len - pos >= 4) {
        uint32_t n = get_u32(p + pos);
        if (big) n = __builtin_bswap32(n);
        if (n < lo || n > hi) { bad = n; break; }
        uint64_t end = pos + 4 + n;
        if (len < end) break;
        PyObject *frame;
        if (kinds) {  /* min_size >= 1 is the caller's to ensure: n == 0 is refused here */
            if (n == 0) { PyErr_SetString(PyExc_ValueError, "a frame without a kind byte"); goto fail; }
            PyObject *kind = PyList_GET_ITEM(kinds, p[pos + 4]);
            PyObject *rest = PyBytes_FromStringAndSize((const char *)p + pos + 5, n - 1);
            frame = rest ? PyTuple_Pack(2, kind, rest) : NULL;
            Py_XDECREF(rest);
        } else {
            frame = PyBytes_FromStringAndSize((const char *)p + pos + 4, n);
        }
        if (!frame || PyList_Append(out, frame) < 0) { Py_XDECREF(frame); goto fail; }
        Py_DECREF(frame);
        pos = end;
    }
    PyObject *result = Py_BuildValue("(NKL)", out, (unsigned long long)pos, bad);
    PyBuffer_Release(&view);
    return result;
fail:
    Py_CLEAR(out);
done:
    PyBuffer_Release(&view);
    return NULL;
}

/* ---- a guest's response frame -------------------------------------------------------- */

/* A str's bytes as `str.encode(latin-1 if latin1 else utf-8)` makes them, or NULL without
 * an exception where that encoding would fail (the caller then leaves it to Python). */
static const char *str_bytes(PyObject *s, int latin1, Py_ssize_t *n) {
    if (latin1) {
        if (PyUnicode_KIND(s) != PyUnicode_1BYTE_KIND) return NULL;  /* a char past U+00FF */
        *n = PyUnicode_GET_LENGTH(s);
        return (const char *)PyUnicode_1BYTE_DATA(s);
    }
    const char *p = PyUnicode_AsUTF8AndSize(s, n);
    if (!p) PyErr_Clear();  /* a lone surrogate: Python's encode raises, and says so */
    return p;
}

/* response_frame(Response, Headers, kind, max_frame, result, max_body) -> bytes | None
 * The frame runtime.executors.python.guest.Session.respond sends for `result` when it is
 * a `Response` (exactly) whose status is an int in 200..599, whose body is bytes or str
 * (UTF-8) of at most `max_body` bytes and whose headers are `Headers` (exactly) of str
 * pairs, names latin-1, values UTF-8: `kind` (one byte), then the ABI's encoding of
 * (status, [(name, value)], body), behind its u32 length (at most `max_frame`). None for
 * anything else (an attribute deleted too): Session's Python path, the reference, then
 * answers or says what is wrong (tests/executors/python/test_guest_respond.py holds the
 * two to the same bytes). The attributes are read as Python reads them (a property the
 * user added runs; again, if this says None). */
static PyObject *response_frame(PyObject *mod, PyObject *const *a, Py_ssize_t nargs) {
    codec_state *st = state_of(mod);
    if (nargs != 6 || !PyBytes_CheckExact(a[2]) || PyBytes_GET_SIZE(a[2]) != 1) {
        PyErr_SetString(PyExc_TypeError, "response_frame(Response, Headers, kind, max_frame, "
                        "result, max_body)");
        return NULL;
    }
    if (!st->names[0]) {
        PyErr_SetString(PyExc_RuntimeError, "_edgefn_codec: bind() was not called");
        return NULL;
    }
    unsigned long long max_frame = PyLong_AsUnsignedLongLong(a[3]);
    unsigned long long max_body = PyLong_AsUnsignedLongLong(a[5]);
    if (PyErr_Occurred()) return NULL;
    if ((PyObject *)Py_TYPE(a[4]) != a[0]) Py_RETURN_NONE;
    PyObject *status = NULL, *body = NULL, *headers = NULL, *items = NULL, *out = NULL;
    status = PyObject_GetAttr(a[4], st->names[0]);
    body = status ? PyObject_GetAttr(a[4], st->names[1]) : NULL;
    headers = body ? PyObject_GetAttr(a[4], st->names[2]) : NULL;
    if (!headers) { PyErr_Clear(); goto none; }  /* one deleted: Python says which first */
    if (!PyLong_CheckExact(status) || (PyObject *)Py_TYPE(headers) != a[1]) goto none;
    long code = PyLong_AsLong(status);
    if (code == -1 && PyErr_Occurred()) { PyErr_Clear(); goto none; }
    if (code < 200 || code > 599) goto none;
    const char *bp;
    Py_ssize_t bn;
    if (PyBytes_CheckExact(body)) {
        bp = PyBytes_AS_STRING(body);
        bn = PyBytes_GET_SIZE(body);
    } else if (PyUnicode_CheckExact(body)) {
        if (!(bp = str_bytes(body, 0, &bn))) goto none;
    } else {
        goto none;  /* bytearray, memoryview, a stream: Python's */
    }
    if ((unsigned long long)bn > max_body) goto none;
    items = PyObject_GetAttr(headers, st->names[3]);
    if (!items) { PyErr_Clear(); goto none; }
    if (!PyList_CheckExact(items)) goto none;
    /* sized first, then written: nothing between runs Python code (the list stays) */
    Py_ssize_t count = PyList_GET_SIZE(items), kn, vn;
    uint64_t size = 1 + 8 + 4 + (uint64_t)bn;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2 ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(t, 0)) ||
                !PyUnicode_CheckExact(PyTuple_GET_ITEM(t, 1)) ||
                !str_bytes(PyTuple_GET_ITEM(t, 0), 1, &kn) ||
                !str_bytes(PyTuple_GET_ITEM(t, 1), 0, &vn))
            goto none;
        size += 8 + (uint64_t)kn + (uint64_t)vn;
        if (size > max_frame) goto none;
    }
    if (size > max_frame || size > U32_MAX) goto none;
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 + size));
    if (!out) goto done;
    char *o = put_u32(PyBytes_AS_STRING(out), size);
    *o++ = PyBytes_AS_STRING(a[2])[0];
    o = put_u32(put_u32(o, (uint64_t)code), (uint64_t)count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        for (int j = 0; j < 2; j++) {
            const char *p = str_bytes(PyTuple_GET_ITEM(t, j), j == 0, &kn);
            o = put_u32(o, (uint64_t)kn);
            memcpy(o, p, (size_t)kn);
            o += kn;
        }
    }
    o = put_u32(o, (uint64_t)bn);
    memcpy(o, bp, (size_t)bn);
    goto done;
none:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(status);
    Py_XDECREF(body);
    Py_XDECREF(headers);
    Py_XDECREF(items);
    return out;
}

/* ---- the module --------------------------------------------------------------------- */

/* bind(encode_request, decode_request, encode_response, decode_response, GuestRequest):
 * the Python twins and the request's type, for this interpreter's module. */
static PyObject *bind(PyObject *mod, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 5 || !PyType_Check(a[4]) ||
            !PyType_IsSubtype((PyTypeObject *)a[4], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "bind(encode_request, decode_request, encode_response, "
                        "decode_response, GuestRequest)");
        return NULL;
    }
    codec_state *st = state_of(mod);
    PyObject **slots[5] = {&st->encode_request, &st->decode_request, &st->encode_response,
                           &st->decode_response, &st->guest_request};
    for (int i = 0; i < 5; i++) Py_XSETREF(*slots[i], Py_NewRef(a[i]));
    static const char *const NAMES[4] = {"status", "body", "headers", "_items"};
    for (int i = 0; i < 4; i++) {
        PyObject *name = PyUnicode_InternFromString(NAMES[i]);
        if (!name) return NULL;
        Py_XSETREF(st->names[i], name);
    }
    Py_RETURN_NONE;
}

static int traverse(PyObject *mod, visitproc visit, void *arg) {
    codec_state *st = state_of(mod);
    Py_VISIT(st->encode_request);
    Py_VISIT(st->decode_request);
    Py_VISIT(st->encode_response);
    Py_VISIT(st->decode_response);
    Py_VISIT(st->guest_request);
    for (int i = 0; i < 4; i++) Py_VISIT(st->names[i]);
    return 0;
}

static int clear(PyObject *mod) {
    codec_state *st = state_of(mod);
    Py_CLEAR(st->encode_request);
    Py_CLEAR(st->decode_request);
    Py_CLEAR(st->encode_response);
    Py_CLEAR(st->decode_response);
    Py_CLEAR(st->guest_request);
    for (int i = 0; i < 4; i++) Py_CLEAR(st->names[i]);
    return 0;
}

static void free_module(void *mod) { clear((PyObject *)mod); }

#define FAST_KW (METH_FASTCALL | METH_KEYWORDS)
static PyMethodDef METHODS[] = {
    {"encode_request", (PyCFunction)(void (*)(void))encode_request, FAST_KW, "abi.encode_request"},
    {"decode_request", (PyCFunction)(void (*)(void))decode_request, FAST_KW, "abi.decode_request"},
    {"encode_response", (PyCFunction)(void (*)(void))encode_response, FAST_KW,
     "abi.encode_response"},
    {"decode_response", (PyCFunction)(void (*)(void))decode_response, FAST_KW,
     "abi.decode_response"},
    {"cut_frames", (PyCFunction)(void (*)(void))cut_frames, METH_FASTCALL,
     "cut_frames(buf, big_endian, min_size, max_size, kinds) -> (frames, end, bad)"},
    {"response_frame", (PyCFunction)(void (*)(void))response_frame, METH_FASTCALL,
     "response_frame(Response, Headers, kind, max_frame, result, max_body) -> bytes | None"},
    {"bind", (PyCFunction)(void (*)(void))bind, METH_FASTCALL,
     "bind(encode_request, decode_request, encode_response, decode_response, GuestRequest)"},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot SLOTS[] = {
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
    {0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_edgefn_codec",
    "The function ABI's hot paths in C (edgefn_core/fastcodec.py)", sizeof(codec_state), METHODS,
    SLOTS, traverse, clear, free_module};

PyMODINIT_FUNC PyInit__edgefn_codec(void) { return PyModuleDef_Init(&MODULE); }
