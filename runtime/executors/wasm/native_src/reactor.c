/*
 * edgefn native fast path for the reactor ABI and the epoch ticker.
 *
 * One call per request instead of ~14 ctypes calls: new store, limits, epoch
 * deadline, instantiate the pre-linked module, look up the three exports, call
 * edgefn_alloc, copy the request in, call edgefn_handle, copy the response out,
 * delete the store. Built with -DEDGEFN_PYEXT it is also a CPython extension whose
 * `serve` encodes the request straight into guest memory and builds the decoded
 * response (status, headers, body) from it: no request or response bytes object,
 * no ctypes argument conversion. Built by runtime/executors/wasm/native.py with the system C
 * compiler against wasmtime-py's own libwasmtime; the wasmtime C API types are
 * declared here by layout (checked against wasmtime-py's ctypes definitions at
 * load time), so no wasmtime headers are needed (wasmtime_c.h).
 */
#ifdef EDGEFN_PYEXT  /* also a CPython extension: `serve` below (Python.h comes first) */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* clock_nanosleep */
#endif
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "wasmtime_c.h"

void edgefn_guest_begin(void);  /* the epoch ticker's, below: around every guest */
void edgefn_guest_end(void);

/* Where a call stopped; mirrored in native.py. BAD_FRAME: `serve` found the response
 * malformed (the Python decoder says how; the bytes are in the result). */
enum { OK = 0, INSTANTIATE = 1, NO_EXPORT = 2, ALLOC = 3, ALLOC_OOB = 4, HANDLE = 5,
       TOO_LARGE = 6, RESPONSE_OOB = 7, NO_MEMORY = 8, BAD_FRAME = 9 };

typedef struct {
    int32_t stage;
    int32_t export_index;  /* NO_EXPORT: which of memory, edgefn_alloc, edgefn_handle */
    wasm_trap_t *trap;     /* owned by the caller when set */
    wasmtime_error_t *error;
    uint64_t a, b;         /* the offending pointer and length */
    uint64_t memory_size;  /* guest memory size when the call stopped */
    const uint8_t *response;  /* a copy, valid until the next call on this thread */
    uint64_t response_len;
} edgefn_result;

/* Instantiation times (store + instance): counts per bucket, the one past the last
 * bound is +Inf, and the sum; added to atomically (worker threads share one). */
typedef struct {
    uint64_t n_bounds;
    uint64_t bounds_ns[16];
    uint64_t counts[17];
    uint64_t sum_ns;
} edgefn_hist;

static int64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void record(edgefn_hist *h, uint64_t ns) {
    uint64_t i = 0;
    while (i < h->n_bounds && ns > h->bounds_ns[i]) i++;
    __atomic_fetch_add(&h->counts[i], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->sum_ns, ns, __ATOMIC_RELAXED);
}

static const char *NAMES[3] = {"memory", "edgefn_alloc", "edgefn_handle"};
static const size_t NAME_LENS[3] = {6, 12, 13};
static _Thread_local uint8_t *out_buf;
static _Thread_local size_t out_cap;

static int copy_out(edgefn_result *r, const uint8_t *src, size_t n) {
    if (n > out_cap) {
        size_t cap = n < 65536 ? 65536 : n;
        uint8_t *p = realloc(out_buf, cap);
        if (!p) return -1;
        out_buf = p;
        out_cap = cap;
    }
    memcpy(out_buf, src, n);
    r->response = out_buf;
    r->response_len = n;
    return 0;
}

static int run(wasmtime_context_t *cx, const wasmtime_instance_pre_t *pre, const uint8_t *req,
               size_t req_len, uint64_t max_response, int handle, edgefn_result *r,
               edgefn_hist *times, int64_t started) {
    wasmtime_instance_t inst;
    wasmtime_extern_t ex[3];
    wasmtime_val_raw_t vals[2];
    r->error = wasmtime_instance_pre_instantiate(pre, cx, &inst, &r->trap);
    if (r->error || r->trap) return INSTANTIATE;
    if (times) record(times, (uint64_t)(monotonic_ns() - started));
    for (int i = 0; i < 3; i++) {
        if (!wasmtime_instance_export_get(cx, &inst, NAMES[i], NAME_LENS[i], &ex[i])) {
            r->export_index = i;
            return NO_EXPORT;
        }
    }
    const void *mem = ex[0].of;
    vals[0].i32 = (int32_t)req_len;
    r->error = wasmtime_func_call_unchecked(cx, ex[1].of, vals, 2, &r->trap);
    r->memory_size = wasmtime_memory_data_size(cx, mem);
    if (r->error || r->trap) { r->b = req_len; return ALLOC; }
    uint64_t ptr = (uint32_t)vals[0].i32;
    if (ptr + req_len > r->memory_size) { r->a = ptr; r->b = req_len; return ALLOC_OOB; }
    memcpy(wasmtime_memory_data(cx, mem) + ptr, req, req_len);
    if (!handle) return OK;
    vals[0].i32 = (int32_t)ptr;
    vals[1].i32 = (int32_t)req_len;
    r->error = wasmtime_func_call_unchecked(cx, ex[2].of, vals, 2, &r->trap);
    r->memory_size = wasmtime_memory_data_size(cx, mem);
    if (r->error || r->trap) return HANDLE;
    uint64_t result = (uint64_t)vals[0].i64;
    r->a = result >> 32;
    r->b = result & 0xffffffffu;
    if (r->b > max_response) return TOO_LARGE;
    if (r->a + r->b > r->memory_size) return RESPONSE_OOB;
    r->response = wasmtime_memory_data(cx, mem) + r->a;  /* in guest memory: the caller copies */
    r->response_len = r->b;
    return OK;
}

/* Run one request (handle=1) or only warm the path (handle=0) in a fresh store;
 * `times` (may be NULL) gets how long the store and instance took. */
int32_t edgefn_reactor_call(wasm_engine_t *engine, const wasmtime_instance_pre_t *pre,
                            int64_t memory_limit, uint64_t deadline_ticks,
                            const uint8_t *req, size_t req_len, uint64_t max_response,
                            int32_t handle, edgefn_result *r, edgefn_hist *times) {
    memset(r, 0, sizeof *r);
    int64_t started = times ? monotonic_ns() : 0;
    wasmtime_store_t *store = wasmtime_store_new(engine, NULL, NULL);
    wasmtime_context_t *cx = wasmtime_store_context(store);
    wasmtime_store_limiter(store, memory_limit, -1, -1, -1, -1);
    wasmtime_context_set_epoch_deadline(cx, deadline_ticks);
    edgefn_guest_begin();
    r->stage = run(cx, pre, req, req_len, max_response, handle, r, times, started);
    edgefn_guest_end();
    if (r->stage == OK && handle && copy_out(r, r->response, r->response_len))
        r->stage = NO_MEMORY;
    wasmtime_store_delete(store);
    return r->stage;
}

int32_t edgefn_result_size(void) { return (int32_t)sizeof(edgefn_result); }
int32_t edgefn_extern_size(void) { return (int32_t)sizeof(wasmtime_extern_t); }
int32_t edgefn_hist_size(void) { return (int32_t)sizeof(edgefn_hist); }

/* The epoch ticker: a native thread, so ticking never takes the GIL.
 *
 * It parks while no guest runs. Every entry that runs a guest calls
 * `edgefn_guest_begin` after setting its epoch deadline and `edgefn_guest_end` once
 * it stopped (a host call in between still counts as running); a ticker parks once
 * none has run for `idle_ns`, and `begin` wakes it. So a running guest always has a
 * ticker, whatever its deadline or how late the wake-up came: woken, the ticker counts
 * from then (the parked time holds no deadline to catch up on), and a guest whose
 * deadline was set while it was parked gets its full budget, late by the wake-up.
 * Idle, a PoP took ~3% of a core for 1000 wake-ups a second. Begin and park cross as
 * Dekker's pair (each stores its word, then loads the other's; all seq_cst), so one
 * always sees the other: begin finds the ticker parked and wakes it, or the ticker
 * sees the guest and does not sleep. A missing `end` keeps the tickers awake (as
 * before they parked); an extra one could let them park under a running guest, so
 * every begin has its end on every path. Tickers of several engines share the words:
 * a begin wakes them all (one that did not need it ticks `idle_ns` more). */
static atomic_int running;          /* guests between begin and end */
static _Atomic int64_t last_end;    /* CLOCK_MONOTONIC ns: when the last one ended */
static atomic_int parked;           /* tickers parked now */
static atomic_uint wake_seq;        /* the futex word the parked tickers wait on */

static void wake_all(void) {
    atomic_fetch_add(&wake_seq, 1);
    syscall(SYS_futex, (uint32_t *)&wake_seq, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

/* A guest is about to run (its epoch deadline is set); pair with `_end`. */
void edgefn_guest_begin(void) {
    atomic_fetch_add(&running, 1);
    if (atomic_load(&parked) > 0) wake_all();
}

void edgefn_guest_end(void) {
    atomic_store(&last_end, monotonic_ns());
    atomic_fetch_sub(&running, 1);
}

typedef struct {
    wasm_engine_t *engine;
    long interval_ns;
    int64_t idle_ns;  /* park once no guest has run for this long; 0: never */
    atomic_int stop;
    _Atomic uint64_t ticks, parks;  /* epochs it added, times it parked (tests read them) */
    pthread_t thread;
} edgefn_ticker;

static bool idle(const edgefn_ticker *t) {
    return t->idle_ns > 0 && atomic_load(&running) == 0 &&
           monotonic_ns() - atomic_load(&last_end) > t->idle_ns;
}

/* One epoch per interval of real time: a late wake-up (a loaded machine) catches
 * up with the ticks it missed, so deadlines in ticks stay deadlines in time. Woken
 * from a park, it counts from then: the idle time holds no deadline to catch up on. */
static void *tick(void *arg) {
    edgefn_ticker *t = arg;
    int64_t start = monotonic_ns(), done = 0;
    while (!atomic_load(&t->stop)) {
        int64_t next = start + (done + 1) * t->interval_ns;
        struct timespec ts = {next / 1000000000L, next % 1000000000L};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        int64_t due = (monotonic_ns() - start) / t->interval_ns;
        if (due > done) atomic_fetch_add(&t->ticks, (uint64_t)(due - done));
        for (; done < due; done++) wasmtime_engine_increment_epoch(t->engine);
        if (!idle(t)) continue;
        unsigned seq = atomic_load(&wake_seq);
        atomic_fetch_add(&parked, 1);
        if (!atomic_load(&t->stop) && idle(t)) {
            atomic_fetch_add(&t->parks, 1);
            syscall(SYS_futex, (uint32_t *)&wake_seq, FUTEX_WAIT_PRIVATE, seq, NULL, NULL, 0);
        }
        atomic_fetch_sub(&parked, 1);
        start = monotonic_ns();
        done = 0;
    }
    return NULL;
}

edgefn_ticker *edgefn_ticker_start(wasm_engine_t *engine, long interval_ns, int64_t idle_ns) {
    edgefn_ticker *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->engine = engine;
    t->interval_ns = interval_ns;
    t->idle_ns = idle_ns;
    if (pthread_create(&t->thread, NULL, tick, t) != 0) { free(t); return NULL; }
    return t;
}

uint64_t edgefn_ticker_ticks(edgefn_ticker *t) { return atomic_load(&t->ticks); }
uint64_t edgefn_ticker_parks(edgefn_ticker *t) { return atomic_load(&t->parks); }

void edgefn_ticker_stop(edgefn_ticker *t) {
    if (!t) return;
    atomic_store(&t->stop, 1);
    wake_all();  /* a parked ticker sees `stop` (it loads it after announcing its park) */
    pthread_join(t->thread, NULL);
    free(t);
}

/* `n` epochs at once: a closing engine moves every guest past its deadline, since no
 * ticker will (a guest spinning on a worker thread then never ended, nor did the
 * process: interpreter exit joins the worker threads). */
void edgefn_epoch_advance(wasm_engine_t *engine, uint64_t n) {
    for (uint64_t i = 0; i < n; i++) wasmtime_engine_increment_epoch(engine);
}

/* A thread keeps at most TRIM_BYTES of its buffers between calls: each worker thread
 * kept one as large as the largest response (or request) it had ever copied, and 16
 * threads of 200 MiB answers pinned 3.2 GB for good. Called (ctypes) once the caller
 * copied a response larger than that. */
#define TRIM_BYTES (1 << 20)
void edgefn_trim(void) {
    if (out_cap > TRIM_BYTES) {
        free(out_buf);
        out_buf = NULL;
        out_cap = 0;
    }
}

#ifdef EDGEFN_PYEXT
/* ---- the CPython extension: one call from the request's fields to the response's ---- */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the ABI's u32s are written as is");

static _Thread_local uint8_t *in_buf;  /* the encoded request, staged while the GIL is held */
static _Thread_local size_t in_cap;

static uint8_t *put_u32(uint8_t *o, uint32_t v) { memcpy(o, &v, 4); return o + 4; }
static uint8_t *put_raw(uint8_t *o, PyObject *b) {
    Py_ssize_t n = PyBytes_GET_SIZE(b);
    memcpy(o, PyBytes_AS_STRING(b), (size_t)n);
    return o + n;
}
static uint8_t *put_str(uint8_t *o, PyObject *b) {
    return put_raw(put_u32(o, (uint32_t)PyBytes_GET_SIZE(b)), b);
}

static int need_bytes(PyObject *o, const char *what) {
    if (PyBytes_CheckExact(o)) return 0;
    PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", what, Py_TYPE(o)->tp_name);
    return -1;
}

/* The request (see edgefn_core/abi.py) from args: method, path, query, headers (a list
 * of (bytes, bytes)), env blob, body, params blob, principal blob; into in_buf. */
static int encode(PyObject *const *a, size_t *out_len) {
    static const char *NAMES_[8] = {"method", "path", "query", "headers", "env", "body",
                                    "params", "principal"};
    for (int i = 0; i < 8; i++)
        if (i != 3 && need_bytes(a[i], NAMES_[i])) return -1;
    if (!PyList_CheckExact(a[3])) {
        PyErr_SetString(PyExc_TypeError, "headers must be a list of (bytes, bytes)");
        return -1;
    }
    Py_ssize_t nh = PyList_GET_SIZE(a[3]);
    uint64_t n = 4 + 12 + 4 + 4;  /* magic, three lengths, header count, body length */
    for (int i = 0; i < 8; i++) if (i != 3) n += (uint64_t)PyBytes_GET_SIZE(a[i]);
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *t = PyList_GET_ITEM(a[3], i);
        if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) != 2 ||
                need_bytes(PyTuple_GET_ITEM(t, 0), "a header name") ||
                need_bytes(PyTuple_GET_ITEM(t, 1), "a header value")) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "headers must be a list of (bytes, bytes)");
            return -1;
        }
        n += 8 + (uint64_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 0))
               + (uint64_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 1));
    }
    if (n > 0x7fffffff) {
        PyErr_SetString(PyExc_OverflowError, "request too large for a 32-bit guest");
        return -1;
    }
    if (n > in_cap) {
        size_t cap = n < 65536 ? 65536 : (size_t)n;
        uint8_t *p = realloc(in_buf, cap);
        if (!p) { PyErr_NoMemory(); return -1; }
        in_buf = p;
        in_cap = cap;
    }
    uint8_t *o = in_buf;
    memcpy(o, "EFQ1", 4);
    o = put_str(put_str(put_str(o + 4, a[0]), a[1]), a[2]);
    o = put_u32(o, (uint32_t)nh);
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *t = PyList_GET_ITEM(a[3], i);
        o = put_str(put_str(o, PyTuple_GET_ITEM(t, 0)), PyTuple_GET_ITEM(t, 1));
    }
    o = put_raw(o, a[4]);
    o = put_str(o, a[5]);
    o = put_raw(put_raw(o, a[6]), a[7]);
    *out_len = (size_t)(o - in_buf);
    return 0;
}

static unsigned char TCHAR[256];  /* RFC 9110 token characters */
#define MAX_HEAD_BYTES (64 << 10)  /* edgefn_core.abi.MAX_HEAD_BYTES */
#define MAX_HEAD_FIELDS 4096       /* edgefn_core.abi.MAX_HEAD_FIELDS */

static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* (status, [(name.lower(), value)], body), or NULL with no exception set when the
 * frame is malformed or a header is invalid (abi.decode_response then says why). */
static PyObject *decode(const uint8_t *p, uint64_t len) {
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
        if (head > MAX_HEAD_BYTES) goto bad;  /* abi.decode_response says so */
        for (uint32_t j = 0; j < n; j++) if (!TCHAR[name[j]]) goto bad;
        for (uint32_t j = 0; j < m; j++)
            if ((value[j] < 0x20 && value[j] != '\t') || value[j] == 0x7f) goto bad;
        PyObject *k = PyBytes_FromStringAndSize(NULL, n);
        PyObject *v = PyBytes_FromStringAndSize((const char *)value, m);
        PyObject *t = k && v ? PyTuple_New(2) : NULL;
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

/* serve(engine, pre, memory_limit, deadline_ticks, max_response, result, times,
 *       method, path, query, headers, env, body, params, principal)
 * -> (status, headers, body), or the stage (an int) where it stopped, with the
 * details in *result (see edgefn_result). Raises TypeError for fields of the
 * wrong type, MemoryError. The GIL is released while wasm runs. */
static PyObject *py_serve(PyObject *mod, PyObject *const *args, Py_ssize_t nargs) {
    (void)mod;
    if (nargs != 15) {
        PyErr_Format(PyExc_TypeError, "serve() takes 15 arguments (%zd given)", nargs);
        return NULL;
    }
    wasm_engine_t *engine = PyLong_AsVoidPtr(args[0]);
    const wasmtime_instance_pre_t *pre = PyLong_AsVoidPtr(args[1]);
    int64_t memory_limit = PyLong_AsLongLong(args[2]);
    uint64_t deadline = PyLong_AsUnsignedLongLong(args[3]);
    uint64_t max_response = PyLong_AsUnsignedLongLong(args[4]);
    edgefn_result *r = PyLong_AsVoidPtr(args[5]);
    edgefn_hist *times = args[6] == Py_None ? NULL : PyLong_AsVoidPtr(args[6]);
    size_t n = 0;
    if (PyErr_Occurred() || !engine || !pre || !r || encode(args + 7, &n)) return NULL;
    memset(r, 0, sizeof *r);
    wasmtime_store_t *store;
    wasmtime_context_t *cx;
    Py_BEGIN_ALLOW_THREADS
    int64_t started = times ? monotonic_ns() : 0;
    store = wasmtime_store_new(engine, NULL, NULL);
    cx = wasmtime_store_context(store);
    wasmtime_store_limiter(store, memory_limit, -1, -1, -1, -1);
    wasmtime_context_set_epoch_deadline(cx, deadline);
    edgefn_guest_begin();
    r->stage = run(cx, pre, in_buf, n, max_response, 1, r, times, started);
    edgefn_guest_end();
    Py_END_ALLOW_THREADS
    PyObject *out = NULL;
    if (r->stage == OK) {
        out = decode(r->response, r->response_len);
        if (!out && !PyErr_Occurred())
            r->stage = copy_out(r, r->response, r->response_len) ? NO_MEMORY : BAD_FRAME;
    }
    wasmtime_store_delete(store);
    if (in_cap > TRIM_BYTES) {  /* (the request is copied into guest memory by now) */
        free(in_buf);
        in_buf = NULL;
        in_cap = 0;
    }
    if (PyErr_Occurred()) { Py_XDECREF(out); return NULL; }
    return out ? out : PyLong_FromLong(r->stage);
}

static PyMethodDef METHODS[] = {
    {"serve", (PyCFunction)(void (*)(void))py_serve, METH_FASTCALL,
     "One reactor request: encode, instantiate, call, decode."},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot SLOTS[] = {
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_edgefn_reactor",
    "edgefn's native reactor call (runtime/executors/wasm/native.py)", 0, METHODS, SLOTS,
    NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__edgefn_reactor(void) {
    const char *extra = "!#$%&'*+-.^_`|~";
    for (int c = '0'; c <= '9'; c++) TCHAR[c] = 1;
    for (int c = 'a'; c <= 'z'; c++) TCHAR[c] = TCHAR[c - 32] = 1;
    for (const char *c = extra; *c; c++) TCHAR[(unsigned char)*c] = 1;
    return PyModuleDef_Init(&MODULE);
}
#endif
