/*
 * edgefn native fast path for the reactor ABI and the epoch ticker.
 *
 * One call per request instead of ~14 ctypes calls: new store, limits, epoch
 * deadline, instantiate the pre-linked module, look up the three exports, call
 * edgefn_alloc, copy the request in, call edgefn_handle, copy the response out,
 * delete the store. Built by runtime/executors/wasm_native.py with the system C
 * compiler against wasmtime-py's own libwasmtime; the wasmtime C API types are
 * declared here by layout (checked against wasmtime-py's ctypes definitions at
 * load time), so no wasmtime headers are needed.
 */
#define _POSIX_C_SOURCE 200809L /* clock_nanosleep */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct wasm_engine_t wasm_engine_t;
typedef struct wasmtime_store wasmtime_store_t;
typedef struct wasmtime_context wasmtime_context_t;
typedef struct wasmtime_instance_pre wasmtime_instance_pre_t;
typedef struct wasmtime_error wasmtime_error_t;
typedef struct wasm_trap_t wasm_trap_t;

typedef struct { uint64_t store_id; size_t private_; } wasmtime_instance_t;
typedef struct { uint8_t kind; uint8_t pad_[7]; uint8_t of[24]; } wasmtime_extern_t;
typedef union { int32_t i32; int64_t i64; uint8_t v128[16]; } wasmtime_val_raw_t;

extern wasmtime_store_t *wasmtime_store_new(wasm_engine_t *, void *, void (*)(void *));
extern wasmtime_context_t *wasmtime_store_context(wasmtime_store_t *);
extern void wasmtime_store_delete(wasmtime_store_t *);
extern void wasmtime_store_limiter(wasmtime_store_t *, int64_t, int64_t, int64_t, int64_t, int64_t);
extern void wasmtime_context_set_epoch_deadline(wasmtime_context_t *, uint64_t);
extern wasmtime_error_t *wasmtime_instance_pre_instantiate(const wasmtime_instance_pre_t *,
    wasmtime_context_t *, wasmtime_instance_t *, wasm_trap_t **);
extern bool wasmtime_instance_export_get(wasmtime_context_t *, const wasmtime_instance_t *,
    const char *, size_t, wasmtime_extern_t *);
extern wasmtime_error_t *wasmtime_func_call_unchecked(wasmtime_context_t *, const void *,
    wasmtime_val_raw_t *, size_t, wasm_trap_t **);
extern uint8_t *wasmtime_memory_data(const wasmtime_context_t *, const void *);
extern size_t wasmtime_memory_data_size(const wasmtime_context_t *, const void *);
extern void wasmtime_engine_increment_epoch(wasm_engine_t *);

/* Where a call stopped; mirrored in wasm_native.py. */
enum { OK = 0, INSTANTIATE = 1, NO_EXPORT = 2, ALLOC = 3, ALLOC_OOB = 4, HANDLE = 5,
       TOO_LARGE = 6, RESPONSE_OOB = 7, NO_MEMORY = 8 };

typedef struct {
    int32_t stage;
    int32_t export_index;  /* NO_EXPORT: which of memory, edgefn_alloc, edgefn_handle */
    wasm_trap_t *trap;     /* owned by the caller when set */
    wasmtime_error_t *error;
    uint64_t a, b;         /* the offending pointer and length */
    uint64_t memory_size;  /* guest memory size when the call stopped */
    const uint8_t *response;  /* valid until the next call on this thread */
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
    if (r->error || r->trap) return ALLOC;
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
    if (copy_out(r, wasmtime_memory_data(cx, mem) + r->a, r->b)) return NO_MEMORY;
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
    r->stage = run(cx, pre, req, req_len, max_response, handle, r, times, started);
    wasmtime_store_delete(store);
    return r->stage;
}

int32_t edgefn_result_size(void) { return (int32_t)sizeof(edgefn_result); }
int32_t edgefn_extern_size(void) { return (int32_t)sizeof(wasmtime_extern_t); }
int32_t edgefn_hist_size(void) { return (int32_t)sizeof(edgefn_hist); }

/* The epoch ticker: a native thread, so ticking never takes the GIL. */
typedef struct {
    wasm_engine_t *engine;
    long interval_ns;
    atomic_int stop;
    pthread_t thread;
} edgefn_ticker;

/* One epoch per interval of real time: a late wake-up (a loaded machine) catches
 * up with the ticks it missed, so deadlines in ticks stay deadlines in time. */
static void *tick(void *arg) {
    edgefn_ticker *t = arg;
    int64_t start = monotonic_ns(), done = 0;
    while (!atomic_load(&t->stop)) {
        int64_t next = start + (done + 1) * t->interval_ns;
        struct timespec ts = {next / 1000000000L, next % 1000000000L};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        int64_t due = (monotonic_ns() - start) / t->interval_ns;
        for (; done < due; done++) wasmtime_engine_increment_epoch(t->engine);
    }
    return NULL;
}

edgefn_ticker *edgefn_ticker_start(wasm_engine_t *engine, long interval_ns) {
    edgefn_ticker *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->engine = engine;
    t->interval_ns = interval_ns;
    if (pthread_create(&t->thread, NULL, tick, t) != 0) { free(t); return NULL; }
    return t;
}

void edgefn_ticker_stop(edgefn_ticker *t) {
    if (!t) return;
    atomic_store(&t->stop, 1);
    pthread_join(t->thread, NULL);
    free(t);
}
