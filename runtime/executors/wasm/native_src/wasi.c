/*
 * edgefn native path for WASI commands (WAGI style): one C call per request, and
 * the request's stdio served in C on the calling thread.
 *
 * `edgefn_wasi_run` makes a fresh store (memory limit, epoch deadline, a WASI
 * context with the request's argv and environment), instantiates the pre-linked
 * module, calls `_start` and hands back what it wrote to stdout and stderr, its
 * exit status, or its trap. The stdio host functions below (fd_write, fd_read,
 * fd_fdstat_get, ...) are defined on the function's Linker in place of wasmtime's
 * (whose preview1 hands each call to its tokio threads and waits) and answer as
 * runtime/executors/wasm/wasi_stdio.py does, call for call: stdin is the request
 * body, stdout the response up to its limit (a write past it ends the run),
 * stderr kept up to STDERR_MAX bytes for the PoP's log, fds 0-2 only (any other
 * is EBADF), at most IOV_MAX iovecs a call; a pointer outside guest memory traps.
 * The streams are per thread: one request runs on a thread at a time.
 *
 * Built by native_wasi.py like reactor.c: against wasmtime-py's libwasmtime,
 * the C API's types declared by layout (wasmtime_c.h).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "wasmtime_c.h"

/* errno values of WASI preview1 */
enum { ESUCCESS = 0, EBADF = 8, EFBIG = 22, EINVAL = 28, ESPIPE = 70 };
#define IOV_MAX 1024  /* iovecs one call takes at most (POSIX's least): past it, EINVAL */
enum { IN = 0, OUT = 1, ERR = 2, CLOSED = -1 };
static const uint64_t RIGHTS[3] = {0x2, 0x40, 0x40};  /* fd_read; fd_write */
#define STDERR_MAX (64u << 10)

/* Where a run stopped; mirrored in native_wasi.py. */
enum { RUN_OK = 0, RUN_CONFIG = 1, RUN_INSTANTIATE = 2, RUN_NO_START = 3, RUN_START = 4 };

typedef struct {
    int32_t stage;
    int32_t overflow;          /* a stdout write went past the limit (and failed) */
    wasm_trap_t *trap;         /* owned by the caller when set */
    wasmtime_error_t *error;   /* owned by the caller when set (proc_exit's status) */
    uint64_t memory_size;      /* guest memory when it stopped */
    const uint8_t *out;        /* stdout, valid until the next run on this thread */
    uint64_t out_len;
    const uint8_t *err;        /* stderr (its first STDERR_MAX bytes), likewise */
    uint64_t err_len;
    uint64_t err_dropped;      /* stderr bytes past STDERR_MAX */
} edgefn_wasi_result;

typedef struct {
    uint8_t *p;
    size_t len, cap;
} buffer;

typedef struct {
    bool active;
    const uint8_t *in;
    size_t in_len, in_at;
    uint64_t limit;
    bool overflow;
    buffer out, err;
    uint64_t err_dropped;
    int8_t fds[3];  /* what fd 0, 1, 2 is (IN, OUT, ERR) or CLOSED */
} streams;

static _Thread_local streams S;

size_t edgefn_wasi_result_size(void) { return sizeof(edgefn_wasi_result); }

static bool append(buffer *b, const uint8_t *src, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) return false;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return true;
}

static wasm_trap_t *trap(const char *msg) { return wasmtime_trap_new(msg, strlen(msg)); }

static int kind_of(int32_t fd) {
    return S.active && fd >= 0 && fd <= 2 ? S.fds[fd] : CLOSED;
}

/* The caller's memory, or NULL (then *t is the trap to return). */
static uint8_t *memory(wasmtime_caller_t *caller, size_t *size, wasm_trap_t **t) {
    wasmtime_extern_t mem;
    if (!wasmtime_caller_export_get(caller, "memory", 6, &mem) ||
        mem.kind != WASMTIME_EXTERN_MEMORY) {
        *t = trap("the module exports no memory");
        return NULL;
    }
    wasmtime_context_t *cx = wasmtime_caller_context(caller);
    *size = wasmtime_memory_data_size(cx, mem.of);
    return wasmtime_memory_data(cx, mem.of);
}

static bool inside(uint32_t ptr, uint64_t len, size_t size) {
    return (uint64_t)ptr + len <= size;
}

static wasm_trap_t *oob(void) { return trap("pointer out of bounds"); }

/* A call's count (bytes written, bytes read) stored at `at`, and success. */
static wasm_trap_t *counted(uint8_t *base, size_t size, uint32_t at, uint32_t count,
                            wasmtime_val_raw_t *v) {
    if (!inside(at, 4, size)) return oob();
    memcpy(base + at, &count, 4);
    v[0].i32 = ESUCCESS;
    return NULL;
}

/* The `i`th iovec of the array at `iovs` (inside memory: checked by the caller). */
static void iovec(const uint8_t *base, uint32_t iovs, uint32_t i, uint32_t *ptr, uint32_t *len) {
    memcpy(ptr, base + iovs + 8 * i, 4);
    memcpy(len, base + iovs + 8 * i + 4, 4);
}

/* The caller's memory for a call on an iovec array: NULL with *t the trap (the
 * array outside memory: checked first, whatever the fd, as wasmtime does) or with
 * *err the errno (more than IOV_MAX of them). */
static uint8_t *iovec_call(wasmtime_caller_t *caller, uint32_t iovs, uint32_t count,
                           size_t *size, wasm_trap_t **t, int32_t *err) {
    uint8_t *base = memory(caller, size, t);
    if (!base) return NULL;
    if (!inside(iovs, (uint64_t)count * 8, *size)) { *t = oob(); return NULL; }
    if (count > IOV_MAX) { *err = EINVAL; return NULL; }
    return base;
}

/* fd_write(fd, iovs, iovs_len, nwritten) -> errno */
wasm_trap_t *edgefn_fd_write(void *env, wasmtime_caller_t *caller, wasmtime_val_raw_t *v,
                             size_t n) {
    (void)env; (void)n;
    int kind = kind_of(v[0].i32);
    uint32_t iovs = (uint32_t)v[1].i32, count = (uint32_t)v[2].i32, at = (uint32_t)v[3].i32;
    size_t size;
    wasm_trap_t *t = NULL;
    int32_t err = ESUCCESS;
    uint8_t *base = iovec_call(caller, iovs, count, &size, &t, &err);
    if (!base) { v[0].i32 = err; return t; }
    if (kind == CLOSED || kind == IN) { v[0].i32 = EBADF; return NULL; }
    uint64_t total = 0;
    for (uint32_t i = 0; i < count; i++) {  /* bounds first: a trap writes nothing */
        uint32_t p, l;
        iovec(base, iovs, i, &p, &l);
        if (!inside(p, l, size)) return oob();
        total += l;
    }
    if (!inside(at, 4, size)) return oob();
    if (kind == OUT && S.out.len + total > S.limit) {
        /* the response is a 502 whatever follows: end the run here (a guest that
           ignored EFBIG wrote on until its CPU limit) */
        S.overflow = true;
        return trap("stdout past the response limit");
    }
    for (uint32_t i = 0; i < count; i++) {
        uint32_t p, l;
        iovec(base, iovs, i, &p, &l);
        if (kind == OUT) {
            if (!append(&S.out, base + p, l)) return trap("out of memory for stdout");
        } else {
            size_t keep = S.err.len >= STDERR_MAX ? 0 : STDERR_MAX - S.err.len;
            if (keep > l) keep = l;
            if (keep && !append(&S.err, base + p, keep)) return trap("out of memory for stderr");
            S.err_dropped += l - keep;
        }
    }
    return counted(base, size, at, (uint32_t)total, v);
}

/* fd_read(fd, iovs, iovs_len, nread) -> errno */
wasm_trap_t *edgefn_fd_read(void *env, wasmtime_caller_t *caller, wasmtime_val_raw_t *v,
                            size_t n) {
    (void)env; (void)n;
    uint32_t iovs = (uint32_t)v[1].i32, count = (uint32_t)v[2].i32, at = (uint32_t)v[3].i32;
    size_t size;
    wasm_trap_t *t = NULL;
    int32_t err = ESUCCESS;
    uint8_t *base = iovec_call(caller, iovs, count, &size, &t, &err);
    if (!base) { v[0].i32 = err; return t; }
    if (kind_of(v[0].i32) != IN) { v[0].i32 = EBADF; return NULL; }
    uint32_t total = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t p, l;
        iovec(base, iovs, i, &p, &l);
        size_t left = S.in_len - S.in_at, take = l < left ? l : left;
        if (!inside(p, take, size)) return oob();
        memcpy(base + p, S.in + S.in_at, take);
        S.in_at += take;
        total += (uint32_t)take;
        if (take < l) break;
    }
    return counted(base, size, at, total, v);
}

/* fd_fdstat_get(fd, out) -> errno: filetype unknown, no flags, its one right. */
wasm_trap_t *edgefn_fd_fdstat_get(void *env, wasmtime_caller_t *caller, wasmtime_val_raw_t *v,
                                  size_t n) {
    (void)env; (void)n;
    int kind = kind_of(v[0].i32);
    uint32_t at = (uint32_t)v[1].i32;
    if (kind == CLOSED) { v[0].i32 = EBADF; return NULL; }
    size_t size;
    wasm_trap_t *t = NULL;
    uint8_t *base = memory(caller, &size, &t);
    if (!base) return t;
    if (!inside(at, 24, size)) return oob();
    memset(base + at, 0, 8);
    memcpy(base + at + 8, &RIGHTS[kind], 8);
    memcpy(base + at + 16, &RIGHTS[kind], 8);
    v[0].i32 = ESUCCESS;
    return NULL;
}

/* fd_filestat_get(fd, out) -> errno: all zeros for a stream. */
wasm_trap_t *edgefn_fd_filestat_get(void *env, wasmtime_caller_t *caller,
                                    wasmtime_val_raw_t *v, size_t n) {
    (void)env; (void)n;
    uint32_t at = (uint32_t)v[1].i32;
    if (kind_of(v[0].i32) == CLOSED) { v[0].i32 = EBADF; return NULL; }
    size_t size;
    wasm_trap_t *t = NULL;
    uint8_t *base = memory(caller, &size, &t);
    if (!base) return t;
    if (!inside(at, 64, size)) return oob();
    memset(base + at, 0, 64);
    v[0].i32 = ESUCCESS;
    return NULL;
}

wasm_trap_t *edgefn_fd_close(void *env, wasmtime_caller_t *caller, wasmtime_val_raw_t *v,
                             size_t n) {
    (void)env; (void)caller; (void)n;
    int32_t fd = v[0].i32;
    if (kind_of(fd) == CLOSED) { v[0].i32 = EBADF; return NULL; }
    S.fds[fd] = CLOSED;
    v[0].i32 = ESUCCESS;
    return NULL;
}

/* fd_renumber(fd, to): `to` becomes what `fd` was; both must be open. */
wasm_trap_t *edgefn_fd_renumber(void *env, wasmtime_caller_t *caller, wasmtime_val_raw_t *v,
                                size_t n) {
    (void)env; (void)caller; (void)n;
    int32_t fd = v[0].i32, to = v[1].i32;
    if (kind_of(fd) == CLOSED || kind_of(to) == CLOSED) { v[0].i32 = EBADF; return NULL; }
    S.fds[to] = S.fds[fd];
    if (to != fd) S.fds[fd] = CLOSED;
    v[0].i32 = ESUCCESS;
    return NULL;
}

/* Calls at a position: ESPIPE on a stream of the kinds they apply to, else EBADF. */
static wasm_trap_t *positioned(wasmtime_val_raw_t *v, bool any, bool readable) {
    int kind = kind_of(v[0].i32);
    bool applies = kind != CLOSED && (any || (kind == IN) == readable);
    v[0].i32 = applies ? ESPIPE : EBADF;
    return NULL;
}

wasm_trap_t *edgefn_fd_seek(void *env, wasmtime_caller_t *c, wasmtime_val_raw_t *v, size_t n) {
    (void)env; (void)c; (void)n;
    return positioned(v, true, false);
}

wasm_trap_t *edgefn_fd_tell(void *env, wasmtime_caller_t *c, wasmtime_val_raw_t *v, size_t n) {
    (void)env; (void)c; (void)n;
    return positioned(v, true, false);
}

wasm_trap_t *edgefn_fd_pread(void *env, wasmtime_caller_t *c, wasmtime_val_raw_t *v, size_t n) {
    (void)env; (void)c; (void)n;
    return positioned(v, false, true);
}

wasm_trap_t *edgefn_fd_pwrite(void *env, wasmtime_caller_t *c, wasmtime_val_raw_t *v,
                              size_t n) {
    (void)env; (void)c; (void)n;
    return positioned(v, false, false);
}

/* The streams this thread's calls serve from now on: stdin `in` (kept alive by the
 * caller until `edgefn_wasi_end`), stdout up to `limit` bytes. */
void edgefn_wasi_begin(const uint8_t *in, size_t in_len, uint64_t limit) {
    S.active = true;
    S.in = in;
    S.in_len = in_len;
    S.in_at = 0;
    S.limit = limit;
    S.overflow = false;
    S.out.len = S.err.len = 0;
    S.err_dropped = 0;
    S.fds[0] = IN; S.fds[1] = OUT; S.fds[2] = ERR;
}

/* No streams here any more (every fd is EBADF): what they took, into `r`. */
void edgefn_wasi_end(edgefn_wasi_result *r) {
    S.active = false;
    S.in = NULL;
    r->overflow = S.overflow;
    r->out = S.out.p;
    r->out_len = S.out.len;
    r->err = S.err.p;
    r->err_len = S.err.len;
    r->err_dropped = S.err_dropped;
}

/* One request: a fresh store, `_start`, its output. Returns the stage it stopped at
 * (RUN_OK: `_start` returned or exited, then r->error holds a nonzero status). */
static int32_t run(wasm_engine_t *engine, const wasmtime_instance_pre_t *pre,
                   int64_t memory_limit, uint64_t ticks, size_t argc, const char *const *argv,
                   size_t envc, const char *const *names, const char *const *values,
                   const uint8_t *in, size_t in_len, uint64_t limit, edgefn_wasi_result *r) {
    edgefn_wasi_begin(in, in_len, limit);
    wasmtime_store_t *store = wasmtime_store_new(engine, NULL, NULL);
    wasmtime_context_t *cx = wasmtime_store_context(store);
    wasmtime_store_limiter(store, memory_limit, -1, -1, -1, -1);
    wasmtime_context_set_epoch_deadline(cx, ticks);
    wasi_config_t *config = wasi_config_new();
    int32_t stage = RUN_OK;
    if (!config || !wasi_config_set_argv(config, argc, argv) ||
        !wasi_config_set_env(config, envc, names, values)) {
        if (config) wasi_config_delete(config);
        stage = RUN_CONFIG;
    } else if ((r->error = wasmtime_context_set_wasi(cx, config)) != NULL) {
        stage = RUN_CONFIG;  /* (it took the config either way) */
    } else {
        wasmtime_instance_t inst;
        wasmtime_extern_t start, mem;
        r->error = wasmtime_instance_pre_instantiate(pre, cx, &inst, &r->trap);
        if (r->error || r->trap) {
            stage = RUN_INSTANTIATE;
        } else if (!wasmtime_instance_export_get(cx, &inst, "_start", 6, &start) ||
                   start.kind != WASMTIME_EXTERN_FUNC) {
            stage = RUN_NO_START;
        } else {
            wasmtime_val_raw_t none[1];
            r->error = wasmtime_func_call_unchecked(cx, start.of, none, 0, &r->trap);
            if (r->trap) stage = RUN_START;
            int status;  /* proc_exit(0) (Go's runtime ends so): as if `_start` returned */
            if (r->error && wasmtime_error_exit_status(r->error, &status) && status == 0) {
                wasmtime_error_delete(r->error);
                r->error = NULL;
            }
            if (wasmtime_instance_export_get(cx, &inst, "memory", 6, &mem) &&
                mem.kind == WASMTIME_EXTERN_MEMORY)
                r->memory_size = wasmtime_memory_data_size(cx, mem.of);
        }
    }
    wasmtime_store_delete(store);
    edgefn_wasi_end(r);
    return stage;
}

/* The string at *p (before `end`), its NUL passed: NULL when none ends before `end`. */
static const char *next_string(const char **p, const char *end) {
    const char *s = *p, *nul = memchr(s, 0, (size_t)(end - s));
    if (!nul) return NULL;
    *p = nul + 1;
    return s;
}

/* One request: a fresh store, `_start`, its output. `strings` (`strings_len` bytes):
 * its argc arguments, then its envc names and values in turn, each ended by a NUL,
 * one buffer the caller made in one step. Returns the stage it stopped at (RUN_OK:
 * `_start` returned or exited, then r->error holds a nonzero status; RUN_CONFIG also
 * when `strings` is not as said). */
int32_t edgefn_wasi_run(wasm_engine_t *engine, const wasmtime_instance_pre_t *pre,
                        int64_t memory_limit, uint64_t ticks, const char *strings,
                        size_t strings_len, size_t argc, size_t envc, const uint8_t *in,
                        size_t in_len, uint64_t limit, edgefn_wasi_result *r) {
    memset(r, 0, sizeof *r);
    if (envc > SIZE_MAX / 8 || argc > SIZE_MAX / 8) return RUN_CONFIG;
    size_t n = argc + 2 * envc;
    const char *stack[256];  /* argv, then the names, then the values */
    const char **argv = n <= 256 ? stack : malloc(n * sizeof *argv);
    if (!argv) return RUN_CONFIG;
    const char **names = argv + argc, **values = names + envc;
    const char *p = strings, *end = strings + strings_len;
    int whole = 1;
    for (size_t i = 0; i < argc && whole; i++) whole = (argv[i] = next_string(&p, end)) != NULL;
    for (size_t i = 0; i < envc && whole; i++)
        whole = (names[i] = next_string(&p, end)) && (values[i] = next_string(&p, end));
    int32_t stage = whole && p == end ? run(engine, pre, memory_limit, ticks, argc, argv, envc,
                                            names, values, in, in_len, limit, r)
                                      : RUN_CONFIG;
    if (argv != stack) free(argv);
    return stage;
}
