/*
 * edgefn native `edgefn.kv_get` host function: a WASM guest's KV read served in C,
 * on the PoP's own LMDB environment, without the GIL or a Python call.
 *
 * The environment and the LMDB code are py-lmdb's: its Environment's MDB_env and
 * the engine vtable it uses (an `MdbApi`, exported by py-lmdb 3.0 as lmdb_api_v09
 * and lmdb_api_v10), found and checked by kv/lmdb_handles.py. Opening the same
 * environment a second time in one process (say with the system liblmdb) would
 * share, then drop, the process's fcntl locks on lock.mdb; reusing py-lmdb's
 * MDB_env avoids that. py-lmdb opens it with MDB_NOTLS, so a read-only
 * transaction is not bound to a thread: a small pool of them is reused, each
 * mdb_txn_renew'ed per read (a fresh snapshot: the read sees every write
 * committed before it) and mdb_txn_reset after (its reader slot stops pinning
 * old pages).
 *
 * Only the plain case runs here: a namespace the function may read now (the
 * table Python fills from the binding's own check, tagged with the owners'
 * generation), a key of 1..511 bytes, pointers inside guest memory, a well-formed
 * record. Anything else (a denied or unknown namespace, a changed grant, a bad
 * pointer, an LMDB error, a closed store) is handed to the Python host function
 * unchanged, which answers or traps exactly as before. Built by native_kv.py
 * like reactor.c: against wasmtime-py's libwasmtime, types declared by layout.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wasmtime_c.h"

typedef struct MDB_env MDB_env;
typedef struct MDB_txn MDB_txn;
typedef unsigned int MDB_dbi;
typedef struct { size_t mv_size; void *mv_data; } MDB_val;
#define MDB_RDONLY 0x20000
#define MDB_NOTFOUND (-30798)

/* py-lmdb 3.0's MdbApi (lmdb/mdb_api.h), by position: only the entries used here
 * are typed. kv/lmdb_handles.py checks the version fields and calls version_fn,
 * the last entry, before any of this is used. */
typedef struct {
    int major, minor, patch;
    unsigned data_version;
    void *env_fns[20];  /* env_create .. reader_list */
    int (*txn_begin)(MDB_env *, MDB_txn *, unsigned, MDB_txn **);
    void *txn_commit;
    void (*txn_abort)(MDB_txn *);
    void (*txn_reset)(MDB_txn *);
    int (*txn_renew)(MDB_txn *);
    void *txn_id;
    void *dbi_fns[4];   /* dbi_open, dbi_flags, dbi_close, drop */
    int (*get)(MDB_txn *, MDB_dbi, MDB_val *, MDB_val *);
    void *rest[9];      /* put, del, stat, cursor_open .. cursor_count */
    void *strerror_fn;
    void *version_fn;
} mdb_api;

typedef wasm_trap_t *(*host_fn)(void *, wasmtime_caller_t *, wasmtime_val_raw_t *, size_t);

/* One KVStore's environment, shared by every function's binding. */
#define POOL 16
typedef struct {
    const mdb_api *api;
    MDB_env *env;
    pthread_mutex_t lock;
    pthread_cond_t idle;
    int closed, busy;
    int n_spare;
    MDB_txn *spare[POOL];
} kvn_store;

/* One deployed version's readable namespaces. */
#define MAX_NS 64
#define MAX_NAME 64
#define MAX_KEY 511
#define HEAD 20 /* u64 version | u64 expires_at_ms | u32 meta_len */
typedef struct {
    uint32_t len;
    MDB_dbi dbi;
    uint8_t name[MAX_NAME];
} kvn_ns;

typedef struct {
    kvn_store *store;
    const uint64_t *generation; /* the owners' claims change: this moves */
    host_fn fallback;           /* the Python kv_get */
    pthread_mutex_t lock;
    uint64_t table_generation;  /* the generation `ns` was filled at; 0: never */
    int n;
    kvn_ns ns[MAX_NS];
} kvn_binding;

kvn_store *edgefn_kv_store_new(const mdb_api *api, MDB_env *env) {
    kvn_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->api = api;
    s->env = env;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->idle, NULL);
    return s;
}

/* Before the environment closes: no read runs after this returns, and every
 * pooled transaction is aborted. The struct itself stays (bindings point at it);
 * reads on a closed store go to the Python path. */
void edgefn_kv_store_close(kvn_store *s) {
    pthread_mutex_lock(&s->lock);
    s->closed = 1;
    while (s->busy) pthread_cond_wait(&s->idle, &s->lock);
    for (int i = 0; i < s->n_spare; i++) s->api->txn_abort(s->spare[i]);
    s->n_spare = 0;
    pthread_mutex_unlock(&s->lock);
}

/* A reset transaction from the pool (or NULL: begin one), or -1 if closed. */
static int take(kvn_store *s, MDB_txn **txn) {
    pthread_mutex_lock(&s->lock);
    if (s->closed) { pthread_mutex_unlock(&s->lock); return -1; }
    s->busy++;
    *txn = s->n_spare ? s->spare[--s->n_spare] : NULL;
    pthread_mutex_unlock(&s->lock);
    return 0;
}

/* Back to the pool, reset (its snapshot released), or aborted when the pool is full. */
static void give_back(kvn_store *s, MDB_txn *txn) {
    if (txn) s->api->txn_reset(txn);  /* the store cannot close while we are busy */
    pthread_mutex_lock(&s->lock);
    if (txn && s->n_spare < POOL) {
        s->spare[s->n_spare++] = txn;
    } else if (txn) {
        s->api->txn_abort(txn);
    }
    if (--s->busy == 0 && s->closed) pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->lock);
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

enum { ABSENT = -1, FALLBACK = -2 };

/* The live value of `key` copied to `out` if it fits `cap`: its length, ABSENT,
 * or FALLBACK (also when it fits but `out` is NULL: outside guest memory). */
static int64_t read_value(kvn_store *s, MDB_dbi dbi, const uint8_t *key, size_t key_len,
                          uint8_t *out, uint64_t cap) {
    MDB_txn *txn;
    if (take(s, &txn)) return FALLBACK;
    int rc;
    if (txn) {
        rc = s->api->txn_renew(txn);
        if (rc) s->api->txn_abort(txn);
    } else {
        rc = s->api->txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    }
    if (rc) { give_back(s, NULL); return FALLBACK; }  /* MDB_MAP_RESIZED, readers full, ... */
    MDB_val k = {key_len, (void *)key}, v;
    int64_t result = FALLBACK;
    rc = s->api->get(txn, dbi, &k, &v);
    if (rc == MDB_NOTFOUND) {
        result = ABSENT;
    } else if (rc == 0 && v.mv_size >= HEAD) {
        const uint8_t *rec = v.mv_data;
        uint64_t exp;
        uint32_t meta;
        memcpy(&exp, rec + 8, 8);
        memcpy(&meta, rec + 16, 4);
        if (exp && (int64_t)exp <= now_ms()) {
            result = ABSENT;
        } else if (HEAD + (uint64_t)meta <= v.mv_size) {
            uint64_t len = v.mv_size - HEAD - meta;
            if (len > cap) result = (int64_t)len;
            else if (out) { memcpy(out, rec + HEAD + meta, len); result = (int64_t)len; }
        }
    }
    give_back(s, txn);
    return result;
}

kvn_binding *edgefn_kv_binding_new(kvn_store *store, const uint64_t *generation,
                                   host_fn fallback) {
    kvn_binding *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->store = store;
    b->generation = generation;
    b->fallback = fallback;
    pthread_mutex_init(&b->lock, NULL);
    return b;
}

void edgefn_kv_binding_free(kvn_binding *b) {
    if (!b) return;
    pthread_mutex_destroy(&b->lock);
    free(b);
}

/* Replace the readable namespaces: `names` holds `n` names of `lens` bytes each,
 * back to back; `dbis` their handles; checked at owners' `generation`. */
int32_t edgefn_kv_binding_set(kvn_binding *b, uint64_t generation, int32_t n,
                              const uint8_t *names, const uint32_t *lens, const uint32_t *dbis) {
    if (n < 0 || n > MAX_NS) return -1;
    pthread_mutex_lock(&b->lock);
    b->n = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i] > MAX_NAME) { pthread_mutex_unlock(&b->lock); return -1; }
        b->ns[i].len = lens[i];
        b->ns[i].dbi = dbis[i];
        memcpy(b->ns[i].name, names, lens[i]);
        names += lens[i];
    }
    b->n = n;
    b->table_generation = generation;
    pthread_mutex_unlock(&b->lock);
    return 0;
}

/* The handle of namespace (name, len) if the table is current and holds it. */
static bool lookup(kvn_binding *b, const uint8_t *name, uint32_t len, MDB_dbi *dbi) {
    bool found = false;
    uint64_t gen = __atomic_load_n(b->generation, __ATOMIC_ACQUIRE);
    pthread_mutex_lock(&b->lock);
    if (gen && gen == b->table_generation) {
        for (int i = 0; i < b->n && !found; i++) {
            if (b->ns[i].len == len && memcmp(b->ns[i].name, name, len) == 0) {
                *dbi = b->ns[i].dbi;
                found = true;
            }
        }
    }
    pthread_mutex_unlock(&b->lock);
    return found;
}

static bool inside(int32_t ptr, int32_t len, size_t size) {
    return ptr >= 0 && len >= 0 && (uint64_t)ptr + (uint64_t)len <= size;
}

/* kv_get(ns, ns_len, key, key_len, buf, cap) -> i64, as a wasmtime unchecked callback. */
wasm_trap_t *edgefn_kv_get(void *env, wasmtime_caller_t *caller, wasmtime_val_raw_t *v,
                           size_t n) {
    kvn_binding *b = env;
    int32_t nsp = v[0].i32, nsl = v[1].i32, kp = v[2].i32, kl = v[3].i32;
    int32_t bp = v[4].i32, cap = v[5].i32;
    wasmtime_extern_t mem;
    MDB_dbi dbi;
    if (!wasmtime_caller_export_get(caller, "memory", 6, &mem) ||
        mem.kind != WASMTIME_EXTERN_MEMORY) return b->fallback(NULL, caller, v, n);
    wasmtime_context_t *cx = wasmtime_caller_context(caller);
    uint8_t *base = wasmtime_memory_data(cx, mem.of);
    size_t size = wasmtime_memory_data_size(cx, mem.of);
    if (!inside(nsp, nsl, size) || !inside(kp, kl, size) || kl < 1 || kl > MAX_KEY ||
        cap < 0 || nsl > MAX_NAME || !lookup(b, base + nsp, (uint32_t)nsl, &dbi))
        return b->fallback(NULL, caller, v, n);
    uint8_t *out = inside(bp, cap, size) ? base + bp : NULL;
    int64_t got = read_value(b->store, dbi, base + kp, (size_t)kl, out, (uint64_t)cap);
    if (got == FALLBACK) return b->fallback(NULL, caller, v, n);
    v[0].i64 = got;
    return NULL;
}
