/*
 * edgefn's rate-limit counters in C (runtime/security/ratelimit/native.py builds and
 * loads it): `Counters` as runtime/security/ratelimit/counters.py has it, the same
 * arithmetic on the same doubles, step for step (a float's `//` and `%` as CPython
 * computes them), so either decides alike: the property tests hold both to `limits`'
 * own strategies and to each other. Per key a `window` (a capsule in a dict keyed as
 * the Python one is). `admits_all` and `count` take a request's checks at once, the
 * native lane's question and its count: the RateLimit fields come back as header
 * lines. Every method runs under the GIL without calling Python code between its
 * reads and writes of the state (keys are str or tuples of str), so each is atomic
 * as the Python one is under its lock.
 *
 * `Counters(table=PATH)` keeps fixed and sliding windows in a table of shared memory
 * (`init_table`) instead, so the PoP processes of `workers = N` count together:
 * one limit, not N. A key is known there by two SipHash-2-4 sums of it under the
 * table's random keys; its window lives in one group of GROUP_SLOTS slots behind the
 * group's robust, process-shared mutex (a worker killed holding it costs its
 * unfinished write, never the lock). A slot whose window has passed is free again;
 * when a group's slots all hold live windows, the one that ends first is given up
 * (`evictions` counts them: that key starts over). Moving windows (their hits' times
 * are O(limit) a key) stay in the process's dict.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SWEEP_AT 50000  /* counters.SWEEP_AT */

enum { FIXED = 0, SLIDING = 1, MOVING = 2 };

typedef struct {
    int algorithm;
    int64_t count;     /* fixed: hits this window; sliding: the current window's */
    int64_t previous;  /* sliding: the previous window's hits */
    int64_t index;     /* sliding: now // window */
    double expires;    /* the sweep drops it once past */
    double *hits;      /* moving: admitted hits' times, oldest first, from hits[head] */
    size_t head, len, cap;
} window_t;

#define TABLE_MAGIC 0x746e436c52666e65ull  /* "efnRlCnt" */
#define TABLE_VERSION 2
#define MAX_WORKERS 256  /* workers that may hold stream slots in one table */
#define GROUP_SLOTS 8
#define LOCK_WAIT_S 1  /* a group held longer than this by another process: an error */

typedef struct {
    uint64_t h0, h1;     /* the key's sums; both 0: never used */
    int32_t algorithm;
    int32_t unused;
    int64_t count, previous, index;
    double expires;      /* free for another key once past */
} slot_t;

typedef struct {
    _Alignas(64) pthread_mutex_t lock;
    slot_t slots[GROUP_SLOTS];
} group_t;

typedef struct {
    uint64_t magic;      /* written last: a table is whole once it reads TABLE_MAGIC */
    uint32_t version, groups;
    uint64_t keys[4];    /* SipHash keys of the two sums */
    uint64_t evictions;  /* live windows given up for another key (atomic) */
    uint64_t recovered;  /* locks taken over from a process that died holding them */
    /* each worker's incarnation: a stream slot written by an earlier one is void */
    uint64_t epochs[MAX_WORKERS];
    _Alignas(64) group_t first[];
} table_t;

typedef struct {
    PyObject_HEAD
    PyObject *state;  /* key -> capsule of a window_t */
    PyObject *clock;
    Py_ssize_t sweep_at, sweep_floor;
    table_t *table;   /* shared fixed and sliding windows, or NULL */
    size_t table_size;
    PyObject *path;
    uint8_t *kbuf;    /* a key's bytes, hashed (reused) */
    size_t kcap;
    PyObject *budget_tag;  /* "budget": a token budget's bucket is keyed (it, bucket) */
    PyObject *stream_tag;  /* "stream": a worker's streams of a bucket, (it, bucket, worker) */
    Py_ssize_t worker, workers;  /* which worker of how many (`join`); workers 0: none */
    uint64_t epoch;        /* its incarnation (`join`) */
} Counters;

static void window_free(PyObject *capsule) {
    window_t *w = PyCapsule_GetPointer(capsule, NULL);
    if (w) { free(w->hits); free(w); }
}

/* CPython's float floor division (`_float_div_mod`), the quotient only. */
static double floor_div(double vx, double wx) {
    double mod = fmod(vx, wx);
    double div = (vx - mod) / wx;
    if (mod) {
        if ((wx < 0) != (mod < 0)) div -= 1.0;
    }
    if (div) {
        double floordiv = floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
        return floordiv;
    }
    return copysign(0.0, vx / wx);
}

/* CPython's float `%` for a positive divisor. */
static double float_mod(double vx, double wx) {
    double mod = fmod(vx, wx);
    if (mod) {
        if ((wx < 0) != (mod < 0)) mod += wx;
    } else {
        mod = copysign(0.0, wx);
    }
    return mod;
}

static int algorithm_of(PyObject *name) {
    if (PyUnicode_Check(name)) {
        if (!PyUnicode_CompareWithASCIIString(name, "sliding_window")) return SLIDING;
        if (!PyUnicode_CompareWithASCIIString(name, "fixed_window")) return FIXED;
        if (!PyUnicode_CompareWithASCIIString(name, "moving_window")) return MOVING;
    }
    PyErr_SetObject(PyExc_KeyError, name);
    return -1;
}

/* The window of `key`, or NULL (no error set) when it has none for `algorithm`. */
static window_t *find(Counters *c, PyObject *key, int algorithm) {
    PyObject *capsule = PyDict_GetItemWithError(c->state, key);
    if (!capsule) return NULL;
    window_t *w = PyCapsule_GetPointer(capsule, NULL);
    return w && w->algorithm == algorithm ? w : NULL;
}

/* A fresh window for `key` (replacing any), or NULL with an exception. */
static window_t *fresh(Counters *c, PyObject *key, int algorithm) {
    window_t *w = calloc(1, sizeof *w);
    if (!w) { PyErr_NoMemory(); return NULL; }
    w->algorithm = algorithm;
    PyObject *capsule = PyCapsule_New(w, NULL, window_free);
    if (!capsule) { free(w); return NULL; }
    int failed = PyDict_SetItem(c->state, key, capsule);
    Py_DECREF(capsule);
    return failed ? NULL : w;
}

/* Moving windows: drop the hits older than `since` (one exactly `since` old stays). */
static void drop_before(window_t *w, double since) {
    while (w->len && w->hits[w->head] < since) { w->head++; w->len--; }
    if (!w->len) w->head = 0;
}

static int append_hit(window_t *w, double now) {
    if (w->head + w->len == w->cap) {
        if (w->head) {
            memmove(w->hits, w->hits + w->head, w->len * sizeof *w->hits);
            w->head = 0;
        } else {
            size_t cap = w->cap ? 2 * w->cap : 4;
            double *p = realloc(w->hits, cap * sizeof *p);
            if (!p) { PyErr_NoMemory(); return -1; }
            w->hits = p;
            w->cap = cap;
        }
    }
    w->hits[w->head + w->len++] = now;
    return 0;
}

/* Drop every window whose time has passed; if that freed little, wait for twice as
 * many keys (`Counters._sweep`). */
static int sweep(Counters *c, double now) {
    Py_ssize_t before = PyDict_GET_SIZE(c->state), pos = 0;
    PyObject *kept = PyDict_New(), *key, *capsule;
    if (!kept) return -1;
    while (PyDict_Next(c->state, &pos, &key, &capsule)) {
        window_t *w = PyCapsule_GetPointer(capsule, NULL);
        if (!w || (w->expires > now && PyDict_SetItem(kept, key, capsule))) {
            Py_DECREF(kept);
            return -1;
        }
    }
    Py_SETREF(c->state, kept);
    Py_ssize_t n = PyDict_GET_SIZE(kept);
    if (n > before / 2) c->sweep_at = n * 2 > c->sweep_floor ? n * 2 : c->sweep_floor;
    return 0;
}

typedef struct {
    int admitted;
    int64_t remaining;
    double reset;  /* epoch seconds */
} outcome_t;

/* One hit of a fixed or sliding window `w` at `now` (`have`: `w` holds the key's
 * window, else it starts one): `Counters._fixed` and `_sliding`. */
static void step(window_t *w, int have, int64_t amount, int64_t window, double now,
                 outcome_t *o) {
    if (w->algorithm == FIXED) {
        if (!have || now >= w->expires) {
            w->count = 0;
            w->expires = now + (double)window;
        }
        w->count++;
        o->admitted = w->count <= amount;
        o->remaining = amount - w->count;
        o->reset = w->expires;
        return;
    }
    int64_t index = (int64_t)floor_div(now, (double)window);
    if (!have || w->index < index - 1) {
        w->count = w->previous = 0;
        w->index = index;
    } else if (w->index == index - 1) {
        w->index = index;
        w->previous = w->count;
        w->count = 0;
    }
    w->expires = (double)((index + 2) * window);
    double left = (double)window - (now - (double)(index * window));
    double weighted = (double)w->previous * left / (double)window + (double)w->count;
    o->admitted = weighted < (double)amount;
    if (o->admitted) {
        w->count++;
        weighted += 1;
    }
    double reset = w->previous ? float_mod(left, (double)window / (double)w->previous)
                               : INFINITY;
    if (w->count) {
        double r = float_mod(left, (double)window);
        if (r < reset) reset = r;
    }
    o->remaining = amount - (int64_t)weighted;
    o->reset = now + (isinf(reset) ? 0.0 : reset);
}

/* Whether a hit of `w` (NULL: the key has no window) at `now` would admit a request,
 * changing nothing: 1 or 0. */
static int decide(const window_t *w, int algorithm, int64_t amount, int64_t window,
                  double now) {
    if (algorithm == FIXED)
        return (!w || now >= w->expires ? 0 : w->count) + 1 <= amount;
    if (algorithm == SLIDING) {
        int64_t index = (int64_t)floor_div(now, (double)window), previous = 0, current = 0;
        if (w && w->index == index - 1) {
            previous = w->count;
        } else if (w && w->index >= index) {
            previous = w->previous;
            current = w->count;
        }
        double left = (double)window - (now - (double)(index * window));
        return (double)previous * left / (double)window + (double)current < (double)amount;
    }
    if (!w) return amount > 0;
    size_t old = 0;
    double since = now - (double)window;
    while (old < w->len && w->hits[w->head + old] < since) old++;
    return (int64_t)(w->len - old) < amount;
}

#include "counters_table.c.h"  /* the shared table: shared_step */

/* One hit of `key` at `now`: `Counters.hit`'s three steps. -1 with an exception. */
static int hit(Counters *c, PyObject *key, int algorithm, int64_t amount, int64_t window,
               double now, outcome_t *o) {
    if (c->table && algorithm != MOVING)
        return shared_step(c, key, algorithm, amount, window, now, o);
    if (PyDict_GET_SIZE(c->state) >= c->sweep_at && sweep(c, now)) return -1;
    window_t *w = find(c, key, algorithm);
    if (!w && PyErr_Occurred()) return -1;
    if (algorithm != MOVING) {
        int have = w != NULL;
        if (!w && !(w = fresh(c, key, algorithm))) return -1;
        step(w, have, amount, window, now, o);
        return 0;
    }
    if (!w && !(w = fresh(c, key, algorithm))) return -1;
    drop_before(w, now - (double)window);
    o->admitted = (int64_t)w->len < amount;
    if (o->admitted && append_hit(w, now)) return -1;
    w->expires = now + (double)window;
    o->remaining = amount - (int64_t)w->len;
    o->reset = (w->len ? w->hits[w->head] : now) + (double)window;
    return 0;
}

/* Whether `hit` at `now` would admit a request, changing nothing: 1, 0, -1 error. */
static int admits(Counters *c, PyObject *key, int algorithm, int64_t amount, int64_t window,
                  double now) {
    if (c->table && algorithm != MOVING)
        return shared_step(c, key, algorithm, amount, window, now, NULL);
    window_t *w = find(c, key, algorithm);
    if (!w && PyErr_Occurred()) return -1;
    return decide(w, algorithm, amount, window, now);
}

/* (key, algorithm, amount, window) from `args`; -1 with an exception. */
static int parse(PyObject *const *args, PyObject **key, int *algorithm, int64_t *amount,
                 int64_t *window) {
    *key = args[0];
    if ((*algorithm = algorithm_of(args[1])) < 0) return -1;
    *amount = PyLong_AsLongLong(args[2]);
    *window = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return -1;
    if (*window <= 0) {
        PyErr_SetString(PyExc_ValueError, "a window lasts at least a second");
        return -1;
    }
    return 0;
}

static int now_of(Counters *c, PyObject *arg, double *now) {
    if (arg == Py_None) {
        PyObject *t = PyObject_CallNoArgs(c->clock);
        if (!t) return -1;
        *now = PyFloat_AsDouble(t);
        Py_DECREF(t);
    } else {
        *now = PyFloat_AsDouble(arg);
    }
    return *now == -1.0 && PyErr_Occurred() ? -1 : 0;
}

/* hit(key, algorithm, amount, window, now=None) -> (admitted, remaining, reset) */
static PyObject *Counters_hit(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *key;
    int algorithm;
    int64_t amount, window;
    double now;
    outcome_t o;
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "hit(key, algorithm, amount, window, now=None)");
        return NULL;
    }
    if (parse(args, &key, &algorithm, &amount, &window) ||
            now_of(c, nargs == 5 ? args[4] : Py_None, &now) ||
            hit(c, key, algorithm, amount, window, now, &o))
        return NULL;
    return Py_BuildValue("(OLd)", o.admitted ? Py_True : Py_False, (long long)o.remaining,
                         o.reset);
}

/* admits(key, algorithm, amount, window, now) -> bool */
static PyObject *Counters_admits(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *key;
    int algorithm;
    int64_t amount, window;
    double now;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "admits(key, algorithm, amount, window, now)");
        return NULL;
    }
    if (parse(args, &key, &algorithm, &amount, &window) || now_of(c, args[4], &now))
        return NULL;
    int r = admits(c, key, algorithm, amount, window, now);
    return r < 0 ? NULL : PyBool_FromLong(r);
}

/* A check as `Counters.prepare` makes it: (key, algorithm, amount, window, name). */
static int check_of(PyObject *check, PyObject **key, int *algorithm, int64_t *amount,
                    int64_t *window) {
    if (!PyTuple_CheckExact(check) || PyTuple_GET_SIZE(check) != 5) {
        PyErr_SetString(PyExc_TypeError, "a check is (key, algorithm, amount, window, name)");
        return -1;
    }
    return parse(&PyTuple_GET_ITEM(check, 0), key, algorithm, amount, window);
}

/* admits_all(checks, now) -> whether every check would admit a request now. */
static PyObject *Counters_admits_all(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "admits_all(checks: list, now)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[0]); i++) {
        PyObject *key;
        int algorithm;
        int64_t amount, window;
        if (check_of(PyList_GET_ITEM(args[0], i), &key, &algorithm, &amount, &window))
            return NULL;
        int r = admits(c, key, algorithm, amount, window, now);
        if (r < 0) return NULL;
        if (!r) Py_RETURN_FALSE;
    }
    Py_RETURN_TRUE;
}

typedef struct {
    char *p;
    size_t len, cap;
} text_t;

static int put(text_t *t, const char *s, size_t n) {
    if (t->len + n > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n) cap *= 2;
        char *p = PyMem_Realloc(t->p, cap);
        if (!p) { PyErr_NoMemory(); return -1; }
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->len, s, n);
    t->len += n;
    return 0;
}

static int put_s(text_t *t, const char *s) { return put(t, s, strlen(s)); }

static int put_i(text_t *t, long long v) {
    char b[24];
    return put(t, b, (size_t)snprintf(b, sizeof b, "%lld", v));
}

/* count(checks, now, fields) -> the RateLimit header lines (b"" without `fields`):
 * each check hit at `now`, in order, as `Limiter.hit` hits them, and their fields as
 * `headers.fields` writes them. Raises RuntimeError if one refuses: `admits_all`
 * admitted the request at that instant, and nothing counted in between (a bug). */
static PyObject *Counters_count(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "count(checks: list, now, fields: bool)");
        return NULL;
    }
    double now = PyFloat_AsDouble(args[1]);
    int fields = PyObject_IsTrue(args[2]);
    if ((now == -1.0 && PyErr_Occurred()) || fields < 0) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(args[0]);
    text_t policy = {0}, state = {0};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *check = PyList_GET_ITEM(args[0], i), *key;
        int algorithm;
        int64_t amount, window;
        outcome_t o;
        if (check_of(check, &key, &algorithm, &amount, &window) ||
                hit(c, key, algorithm, amount, window, now, &o))
            goto fail;
        Py_ssize_t name_len;
        const char *name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(check, 4), &name_len);
        if (!name) goto fail;
        if (!o.admitted && !(c->table && algorithm != MOVING)) {  /* shared: another
             * process may have filled it since `admits_all` (it counts as Redis does) */
            PyErr_Format(PyExc_RuntimeError, "rate limit '%s' refused at %R what it admitted "
                         "then", name, args[1]);
            goto fail;
        }
        if (!fields) continue;
        double t = ceil(o.reset - now);
        if ((i && (put_s(&policy, ", ") || put_s(&state, ", "))) ||
                put_s(&policy, "\"") || put(&policy, name, (size_t)name_len) ||
                put_s(&policy, "\";q=") || put_i(&policy, amount) || put_s(&policy, ";w=") ||
                put_i(&policy, window) ||
                put_s(&state, "\"") || put(&state, name, (size_t)name_len) ||
                put_s(&state, "\";r=") || put_i(&state, o.remaining > 0 ? o.remaining : 0) ||
                put_s(&state, ";t=") || put_i(&state, t > 0 ? (long long)t : 0))
            goto fail;
    }
    PyObject *out;
    if (!fields || !n) {
        out = PyBytes_FromStringAndSize("", 0);
    } else {
        out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(policy.len + state.len + 33));
        if (out) {
            char *o = PyBytes_AS_STRING(out);
            memcpy(o, "ratelimit-policy: ", 18);
            memcpy(o += 18, policy.p, policy.len);
            memcpy(o += policy.len, "\r\nratelimit: ", 13);
            memcpy(o += 13, state.p, state.len);
            memcpy(o + state.len, "\r\n", 2);
        }
    }
    PyMem_Free(policy.p);
    PyMem_Free(state.p);
    return out;
fail:
    PyMem_Free(policy.p);
    PyMem_Free(state.p);
    return NULL;
}

/* The state as counters.py keeps it (key -> list), a copy: for tests. */
static PyObject *Counters_get_state(Counters *c, void *closure) {
    (void)closure;
    PyObject *out = PyDict_New(), *key, *capsule;
    Py_ssize_t pos = 0;
    if (!out) return NULL;
    while (PyDict_Next(c->state, &pos, &key, &capsule)) {
        window_t *w = PyCapsule_GetPointer(capsule, NULL);
        PyObject *v = NULL;
        if (!w) goto fail;
        if (w->algorithm == FIXED) {
            v = Py_BuildValue("[Ld]", (long long)w->count, w->expires);
        } else if (w->algorithm == SLIDING) {
            v = Py_BuildValue("[LLLL]", (long long)w->index, (long long)w->previous,
                              (long long)w->count, (long long)w->expires);
        } else {
            PyObject *hits = PyList_New((Py_ssize_t)w->len), *deque = NULL, *mod;
            for (size_t i = 0; hits && i < w->len; i++) {
                PyObject *f = PyFloat_FromDouble(w->hits[w->head + i]);
                if (!f) Py_CLEAR(hits); else PyList_SET_ITEM(hits, (Py_ssize_t)i, f);
            }
            if (hits && (mod = PyImport_ImportModule("collections"))) {
                deque = PyObject_CallMethod(mod, "deque", "O", hits);
                Py_DECREF(mod);
            }
            Py_XDECREF(hits);
            if (deque) v = Py_BuildValue("[Nd]", deque, w->expires);
        }
        if (!v || PyDict_SetItem(out, key, v)) { Py_XDECREF(v); goto fail; }
        Py_DECREF(v);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static int Counters_init(Counters *c, PyObject *args, PyObject *kwargs) {
    static char *kw[] = {"clock", "table", NULL};
    PyObject *clock = NULL, *table = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:Counters", kw, &clock, &table))
        return -1;
    close_table(c);
    if (table != Py_None && open_table(c, table)) return -1;
    if (!c->budget_tag && !(c->budget_tag = PyUnicode_FromString("budget"))) return -1;
    if (!c->stream_tag && !(c->stream_tag = PyUnicode_FromString("stream"))) return -1;
    c->workers = 0;
    if (!clock) {
        PyObject *time = PyImport_ImportModule("time");
        if (!time) return -1;
        clock = PyObject_GetAttrString(time, "time");
        Py_DECREF(time);
        if (!clock) return -1;
    } else {
        Py_INCREF(clock);
    }
    Py_XSETREF(c->clock, clock);
    Py_XSETREF(c->state, PyDict_New());
    c->sweep_at = c->sweep_floor = SWEEP_AT;
    return c->state ? 0 : -1;
}

static int Counters_traverse(Counters *c, visitproc visit, void *arg) {
    Py_VISIT(c->state);
    Py_VISIT(c->clock);
    Py_VISIT(Py_TYPE(c));
    return 0;
}

static int Counters_clear(Counters *c) {
    Py_CLEAR(c->state);
    Py_CLEAR(c->clock);
    Py_CLEAR(c->path);
    Py_CLEAR(c->budget_tag);
    Py_CLEAR(c->stream_tag);
    return 0;
}

static void Counters_dealloc(Counters *c) {
    PyTypeObject *type = Py_TYPE(c);
    PyObject_GC_UnTrack(c);
    Counters_clear(c);
    close_table(c);
    type->tp_free(c);
    Py_DECREF(type);
}

static PyMethodDef COUNTERS_METHODS[] = {
    {"hit", (PyCFunction)(void (*)(void))Counters_hit, METH_FASTCALL,
     "hit(key, algorithm, amount, window, now=None) -> (admitted, remaining, reset)"},
    {"admits", (PyCFunction)(void (*)(void))Counters_admits, METH_FASTCALL,
     "admits(key, algorithm, amount, window, now) -> whether hit would admit, counting nothing"},
    {"admits_all", (PyCFunction)(void (*)(void))Counters_admits_all, METH_FASTCALL,
     "admits_all(checks, now) -> whether every check would admit, counting nothing"},
    {"count", (PyCFunction)(void (*)(void))Counters_count, METH_FASTCALL,
     "count(checks, now, fields) -> the RateLimit header lines; RuntimeError if refused"},
    {"reserve", (PyCFunction)(void (*)(void))Counters_reserve, METH_FASTCALL,
     "reserve(buckets, limits, amount, now) -> window id, or (index, previous, current) "
     "of the first bucket it does not fit (shared table only)"},
    {"settle", (PyCFunction)(void (*)(void))Counters_settle, METH_FASTCALL,
     "settle(buckets, window, delta): add delta to each bucket's window (shared table only)"},
    {"join", (PyCFunction)(void (*)(void))Counters_join, METH_FASTCALL,
     "join(worker, workers): hold stream slots as this worker, voiding those its earlier "
     "incarnations held (shared table only)"},
    {"acquire", (PyCFunction)(void (*)(void))Counters_acquire, METH_FASTCALL,
     "acquire(buckets, caps) -> the index of the first full bucket, or None when a slot "
     "of each was taken (after join)"},
    {"release", (PyCFunction)Counters_release, METH_O,
     "release(buckets): give back a slot of each (after join)"},
    {"_hold", (PyCFunction)Counters_hold, METH_O,
     "_hold(key): lock key's group of the table and keep it locked (tests)"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef COUNTERS_MEMBERS[] = {
    {"sweep_at", Py_T_PYSSIZET, offsetof(Counters, sweep_at), 0, "sweep at this many keys"},
    {"sweep_floor", Py_T_PYSSIZET, offsetof(Counters, sweep_floor), 0,
     "the least sweep_at a sweep sets"},
    {"clock", Py_T_OBJECT_EX, offsetof(Counters, clock), Py_READONLY, "epoch seconds"},
    {NULL, 0, 0, 0, NULL}};

static PyGetSetDef COUNTERS_GETSET[] = {
    {"state", (getter)Counters_get_state, NULL, "a copy of the state (key -> list)", NULL},
    {"table", (getter)Counters_get_table, NULL,
     "the shared table's path (None: this process's memory only)", NULL},
    {"table_stats", (getter)Counters_get_table_stats, NULL,
     "the shared table's evictions, recovered locks and groups (None without one)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot COUNTERS_SLOTS[] = {
    {Py_tp_doc, "Rate-limit counters in this process's memory (see counters.py)."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, Counters_init},
    {Py_tp_dealloc, Counters_dealloc},
    {Py_tp_traverse, Counters_traverse},
    {Py_tp_clear, Counters_clear},
    {Py_tp_methods, COUNTERS_METHODS},
    {Py_tp_members, COUNTERS_MEMBERS},
    {Py_tp_getset, COUNTERS_GETSET},
    {0, NULL}};

static PyType_Spec COUNTERS_SPEC = {"_edgefn_counters.Counters", sizeof(Counters), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, COUNTERS_SLOTS};

static int exec_module(PyObject *m) {
    PyObject *type = PyType_FromModuleAndSpec(m, &COUNTERS_SPEC, NULL);
    if (!type) return -1;
    int failed = PyModule_AddObjectRef(m, "Counters", type);
    Py_DECREF(type);
    return failed;
}

static PyMethodDef MODULE_METHODS[] = {
    {"init_table", init_table, METH_VARARGS,
     "init_table(fd, groups): make the new file on fd a shared table of rate-limit windows"},
    {NULL, NULL, 0, NULL}};

static PyModuleDef_Slot SLOTS[] = {
    {Py_mod_exec, exec_module},
    {0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_edgefn_counters",
    "edgefn's rate-limit counters (runtime/security/ratelimit/native.py)", 0, MODULE_METHODS,
    SLOTS,
    NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__edgefn_counters(void) { return PyModuleDef_Init(&MODULE); }
