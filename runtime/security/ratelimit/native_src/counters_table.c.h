/*
 * The shared table of counters.c (included there): fixed and sliding windows in a
 * file of shared memory that every PoP process of `workers = N` maps, so they count
 * together. `init_table` makes one (in the workers' parent, a memfd, before it starts
 * them: native.py `SharedTable`); `Counters(table=PATH)` maps it. See counters.c's head for the layout's promises.
 * `shared_step` is the hits and questions of counters.c's `hit` and `admits` there.
 */

static size_t table_bytes(uint32_t groups) {
    return sizeof(table_t) + (size_t)groups * sizeof(group_t);
}

/* SipHash-2-4 of `n` bytes under (k0, k1). */
#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                      \
    do {                                                              \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);     \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                        \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                        \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);     \
    } while (0)

static uint64_t siphash(const uint8_t *in, size_t n, uint64_t k0, uint64_t k1) {
    uint64_t v0 = 0x736f6d6570736575ull ^ k0, v1 = 0x646f72616e646f6dull ^ k1;
    uint64_t v2 = 0x6c7967656e657261ull ^ k0, v3 = 0x7465646279746573ull ^ k1;
    uint64_t b = (uint64_t)n << 56, m;
    const uint8_t *end = in + n - (n % 8);
    for (; in != end; in += 8) {
        memcpy(&m, in, 8);  /* little-endian: the machines the table is shared on */
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    for (size_t i = 0; i < n % 8; i++) b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

static int kput(Counters *c, size_t *len, const void *p, size_t n) {
    if (*len + n > c->kcap) {
        size_t cap = c->kcap ? c->kcap : 256;
        while (cap < *len + n) cap *= 2;
        uint8_t *b = PyMem_Realloc(c->kbuf, cap);
        if (!b) { PyErr_NoMemory(); return -1; }
        c->kbuf = b;
        c->kcap = cap;
    }
    memcpy(c->kbuf + *len, p, n);
    *len += n;
    return 0;
}

/* `key` as bytes that tell any two keys apart (each part typed and sized): a str, bytes,
 * an int, or a tuple of them (nested). -1 with TypeError for anything else. */
static int key_bytes(Counters *c, PyObject *key, size_t *len) {
    uint8_t tag;
    uint32_t n;
    if (PyUnicode_Check(key)) {
        Py_ssize_t size;
        const char *s = PyUnicode_AsUTF8AndSize(key, &size);
        if (!s) return -1;
        tag = 's', n = (uint32_t)size;
        return kput(c, len, &tag, 1) || kput(c, len, &n, 4) || kput(c, len, s, (size_t)size);
    }
    if (PyBytes_Check(key)) {
        tag = 'b', n = (uint32_t)PyBytes_GET_SIZE(key);
        return kput(c, len, &tag, 1) || kput(c, len, &n, 4) ||
               kput(c, len, PyBytes_AS_STRING(key), n);
    }
    if (PyLong_Check(key)) {
        long long v = PyLong_AsLongLong(key);
        if (v == -1 && PyErr_Occurred()) return -1;
        tag = 'i';
        return kput(c, len, &tag, 1) || kput(c, len, &v, 8);
    }
    if (PyTuple_Check(key)) {
        tag = 't', n = (uint32_t)PyTuple_GET_SIZE(key);
        if (kput(c, len, &tag, 1) || kput(c, len, &n, 4)) return -1;
        for (uint32_t i = 0; i < n; i++)
            if (key_bytes(c, PyTuple_GET_ITEM(key, i), len)) return -1;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "a shared counter's key is str, bytes, int or a tuple of "
                 "them, not %.100s", Py_TYPE(key)->tp_name);
    return -1;
}

/* `key`'s two sums; -1 with an exception. */
static int sums_of(Counters *c, PyObject *key, uint64_t *h0, uint64_t *h1) {
    size_t len = 0;
    if (key_bytes(c, key, &len)) return -1;
    *h0 = siphash(c->kbuf, len, c->table->keys[0], c->table->keys[1]);
    *h1 = siphash(c->kbuf, len, c->table->keys[2], c->table->keys[3]) | 1;  /* never 0: 0,0
                                                                           * is a slot never used */
    return 0;
}

/* Lock `g`, taking it over from a process that died holding it; -1 with TimeoutError
 * (held past LOCK_WAIT_S) or OSError. */
static int lock_group(Counters *c, group_t *g) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += LOCK_WAIT_S;
    int r = pthread_mutex_timedlock(&g->lock, &until);
    if (r == EOWNERDEAD) {  /* its holder died: its write may be half done, the rest holds */
        pthread_mutex_consistent(&g->lock);
        __atomic_add_fetch(&c->table->recovered, 1, __ATOMIC_RELAXED);
        r = 0;
    }
    if (r) {
        errno = r;
        PyErr_Format(r == ETIMEDOUT ? PyExc_TimeoutError : PyExc_OSError,
                     "the shared rate-limit table %R: a group's lock: %s", c->path,
                     strerror(r));
        return -1;
    }
    return 0;
}

/* The group of `key`, locked, and its two sums; NULL with an exception. */
static group_t *lock_key(Counters *c, PyObject *key, uint64_t *h0, uint64_t *h1) {
    if (sums_of(c, key, h0, h1)) return NULL;
    group_t *g = &c->table->first[*h0 % c->table->groups];
    return lock_group(c, g) ? NULL : g;
}

static slot_t *slot_of(group_t *g, uint64_t h0, uint64_t h1) {
    for (int i = 0; i < GROUP_SLOTS; i++)
        if (g->slots[i].h0 == h0 && g->slots[i].h1 == h1) return &g->slots[i];
    return NULL;
}

#define STREAM 4  /* a slot's `algorithm` for a worker's streams of a bucket */

/* Whether `s` is a worker's streams written by an earlier incarnation of it. */
static int stale(const Counters *c, const slot_t *s) {
    return s->algorithm == STREAM &&
        (uint64_t)s->index != __atomic_load_n(&c->table->epochs[s->previous], __ATOMIC_RELAXED);
}

/* A slot of `g` for a new key: one never used, whose window has passed or that holds
 * an earlier incarnation's streams, else the one whose window ends first (counted in
 * `evictions`). */
static slot_t *claim(Counters *c, group_t *g, double now) {
    slot_t *first = &g->slots[0];
    for (int i = 0; i < GROUP_SLOTS; i++) {
        slot_t *s = &g->slots[i];
        if ((!s->h0 && !s->h1) || s->expires <= now || stale(c, s)) return s;
        if (s->expires < first->expires) first = s;
    }
    __atomic_add_fetch(&c->table->evictions, 1, __ATOMIC_RELAXED);
    return first;
}

static void load(window_t *w, const slot_t *s) {
    w->count = s->count;
    w->previous = s->previous;
    w->index = s->index;
    w->expires = s->expires;
}

/* With `o`, one hit of `key` at `now` (`Counters.hit`'s steps on its slot, claimed if
 * it has none); without, whether one would admit a request, changing nothing (1, 0).
 * -1 with an exception. */
static int shared_step(Counters *c, PyObject *key, int algorithm, int64_t amount,
                       int64_t window, double now, outcome_t *o) {
    uint64_t h0, h1;
    group_t *g = lock_key(c, key, &h0, &h1);
    if (!g) return -1;
    slot_t *s = slot_of(g, h0, h1);
    window_t w = {.algorithm = algorithm};
    int have = s && s->algorithm == algorithm, r = 0;
    if (have) load(&w, s);
    if (!o) {
        r = decide(have ? &w : NULL, algorithm, amount, window, now);
    } else {
        step(&w, have, amount, window, now, o);
        if (!s) s = claim(c, g, now);
        *s = (slot_t){.h0 = h0, .h1 = h1, .algorithm = algorithm, .count = w.count,
                      .previous = w.previous, .index = w.index, .expires = w.expires};
    }
    pthread_mutex_unlock(&g->lock);
    return r;
}

/* init_table(fd, groups): make the file open on `fd` (new, empty: a memfd, or a file
 * created for it) a table of `groups` groups, for `Counters(table=PATH)` in every
 * process that counts together. Raises OSError, ValueError for 0 groups. */
static PyObject *init_table(PyObject *module, PyObject *args) {
    (void)module;
    int fd;
    unsigned int groups;
    if (!PyArg_ParseTuple(args, "iI:init_table", &fd, &groups)) return NULL;
    if (!groups) {
        PyErr_SetString(PyExc_ValueError, "a table has at least one group");
        return NULL;
    }
    size_t size = table_bytes(groups);
    table_t *t = MAP_FAILED;
    pthread_mutexattr_t attr;
    int attr_made = 0;
    if (ftruncate(fd, (off_t)size)) goto fail;
    t = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (t == MAP_FAILED) goto fail;
    if (getrandom(t->keys, sizeof t->keys, 0) != (ssize_t)sizeof t->keys) goto fail;
    if ((errno = pthread_mutexattr_init(&attr))) goto fail;
    attr_made = 1;
    if ((errno = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED)) ||
            (errno = pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST)))
        goto fail;
    for (uint32_t i = 0; i < groups; i++)
        if ((errno = pthread_mutex_init(&t->first[i].lock, &attr))) goto fail;
    pthread_mutexattr_destroy(&attr);
    t->version = TABLE_VERSION;
    t->groups = groups;
    __atomic_store_n(&t->magic, TABLE_MAGIC, __ATOMIC_RELEASE);
    munmap(t, size);
    Py_RETURN_NONE;
fail:
    PyErr_SetFromErrno(PyExc_OSError);
    if (attr_made) pthread_mutexattr_destroy(&attr);
    if (t != MAP_FAILED) munmap(t, size);
    return NULL;
}

/* Map the table at `path` into `c`. -1 with OSError (it cannot be opened) or ValueError
 * (it is not a whole table of this version). */
static int open_table(Counters *c, PyObject *path) {
    PyObject *bytes;
    if (!PyUnicode_FSConverter(path, &bytes)) return -1;
    int fd = open(PyBytes_AS_STRING(bytes), O_RDWR | O_CLOEXEC);
    Py_DECREF(bytes);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, path);
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size;
    table_t *t = size >= sizeof(table_t) ?
        mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (t == MAP_FAILED) {
        PyErr_Format(PyExc_ValueError, "%R is not a rate-limit table (%zu bytes)", path, size);
        return -1;
    }
    if (__atomic_load_n(&t->magic, __ATOMIC_ACQUIRE) != TABLE_MAGIC ||
            t->version != TABLE_VERSION || !t->groups || table_bytes(t->groups) != size) {
        munmap(t, size);
        PyErr_Format(PyExc_ValueError, "%R is not a rate-limit table of version %d (made by "
                     "another edgefn, or not one at all)", path, TABLE_VERSION);
        return -1;
    }
    c->table = t;
    c->table_size = size;
    Py_INCREF(path);
    Py_XSETREF(c->path, path);
    return 0;
}

static void close_table(Counters *c) {
    if (c->table) munmap(c->table, c->table_size);
    c->table = NULL;
    PyMem_Free(c->kbuf);
    c->kbuf = NULL;
    c->kcap = 0;
}

/* Token budgets (budget.py's sliding-window counter of reserved tokens, a minute a
 * window): a bucket's slot holds its current window (`index`, `count`) and the one
 * before (`previous`), keyed by ("budget", bucket). */
#define BUDGET 3          /* a slot's `algorithm` for a budget's bucket */
#define BUDGET_WINDOW 60  /* budget.WINDOW */
#define MAX_BUCKETS 8

static int by_address(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)*(group_t *const *)a, y = (uintptr_t)*(group_t *const *)b;
    return (x > y) - (x < y);
}

/* Lock `groups` (n of them, repeats allowed), each once, in address order (no two
 * processes wait on each other); `order` (n entries) keeps the order for
 * `unlock_all`. -1 with an exception, nothing left locked. */
static int lock_all(Counters *c, group_t **groups, group_t **order, Py_ssize_t n) {
    memcpy(order, groups, (size_t)n * sizeof *order);
    qsort(order, (size_t)n, sizeof *order, by_address);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i && order[i] == order[i - 1]) continue;
        if (lock_group(c, order[i])) {
            for (Py_ssize_t j = i - 1; j >= 0; j--)
                if (!j || order[j] != order[j - 1]) pthread_mutex_unlock(&order[j]->lock);
            return -1;
        }
    }
    return 0;
}

static void unlock_all(group_t **order, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (!i || order[i] != order[i - 1]) pthread_mutex_unlock(&order[i]->lock);
}

/* The slots of `list` (str: at most MAX_BUCKETS), keyed (`tag`, name) or, with `count`
 * workers from `first` on, (`tag`, name, worker) for each of them (bucket-major): their
 * sums and groups. The count of keys, or -1 with an exception. */
static Py_ssize_t keys_of(Counters *c, PyObject *tag, PyObject *list, Py_ssize_t first,
                          Py_ssize_t count, group_t **groups, uint64_t *h0, uint64_t *h1) {
    if (!c->table) {
        PyErr_SetString(PyExc_ValueError, "token budgets need a shared table");
        return -1;
    }
    if (!PyList_CheckExact(list) || PyList_GET_SIZE(list) > MAX_BUCKETS) {
        PyErr_SetString(PyExc_TypeError, "buckets: a list of at most 8 str");
        return -1;
    }
    Py_ssize_t n = 0, per = count ? count : 1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++)
        for (Py_ssize_t w = first; w < first + per; w++, n++) {
            PyObject *key = count ? Py_BuildValue("(OOn)", tag, PyList_GET_ITEM(list, i), w)
                                  : PyTuple_Pack(2, tag, PyList_GET_ITEM(list, i));
            int failed = !key || sums_of(c, key, &h0[n], &h1[n]);
            Py_XDECREF(key);
            if (failed) return -1;
            groups[n] = &c->table->first[h0[n] % c->table->groups];
        }
    return n;
}

/* A bucket's tokens in window `wid` - 1 and `wid` (0 for none). */
static void budget_use(const slot_t *s, int64_t wid, int64_t *prev, int64_t *cur) {
    *prev = *cur = 0;
    if (s && s->index == wid) {
        *prev = s->previous;
        *cur = s->count;
    } else if (s && s->index == wid - 1) {
        *prev = s->count;
    }
}

/* reserve(buckets, limits, amount, now) -> the window's id, or (index, previous,
 * current) of the first bucket it does not fit: `MemoryBudgetStore.reserve_now`'s
 * steps, all buckets at once for every process sharing the table. */
static PyObject *Counters_reserve(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "reserve(buckets, limits: list, amount, now)");
        return NULL;
    }
    long long amount = PyLong_AsLongLong(args[2]);
    double seconds = PyFloat_AsDouble(args[3]), now = seconds / BUDGET_WINDOW;
    if (PyErr_Occurred()) return NULL;
    int64_t limits[MAX_BUCKETS], wid = (int64_t)floor(now);
    double frac = now - (double)wid;
    group_t *groups[MAX_BUCKETS], *order[MAX_BUCKETS];
    uint64_t h0[MAX_BUCKETS], h1[MAX_BUCKETS];
    if (PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[0])) {
        PyErr_SetString(PyExc_ValueError, "one limit a bucket");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(args[1]) && i < MAX_BUCKETS; i++) {
        limits[i] = PyLong_AsLongLong(PyList_GET_ITEM(args[1], i));
        if (PyErr_Occurred()) return NULL;
    }
    Py_ssize_t n = keys_of(c, c->budget_tag, args[0], 0, 0, groups, h0, h1);
    if (n < 0 || lock_all(c, groups, order, n)) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t prev, cur;
        budget_use(slot_of(groups[i], h0[i], h1[i]), wid, &prev, &cur);
        if ((double)prev * (1 - frac) + (double)cur + (double)amount > (double)limits[i]) {
            unlock_all(order, n);
            return Py_BuildValue("(nLL)", i, (long long)prev, (long long)cur);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        slot_t *s = slot_of(groups[i], h0[i], h1[i]);
        int64_t prev, cur;
        budget_use(s, wid, &prev, &cur);
        if (!s) s = claim(c, groups[i], seconds);
        *s = (slot_t){.h0 = h0[i], .h1 = h1[i], .algorithm = BUDGET, .index = wid,
                      .previous = prev, .count = cur + amount,
                      .expires = (double)((wid + 2) * BUDGET_WINDOW)};
    }
    unlock_all(order, n);
    return PyLong_FromLongLong(wid);
}

/* settle(buckets, window, delta): add `delta` to each bucket's window `window` where it
 * still holds it, never below zero (`MemoryBudgetStore.settle`). */
static PyObject *Counters_settle(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "settle(buckets, window, delta)");
        return NULL;
    }
    long long window = PyLong_AsLongLong(args[1]), delta = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    group_t *groups[MAX_BUCKETS], *order[MAX_BUCKETS];
    uint64_t h0[MAX_BUCKETS], h1[MAX_BUCKETS];
    Py_ssize_t n = keys_of(c, c->budget_tag, args[0], 0, 0, groups, h0, h1);
    if (n < 0 || lock_all(c, groups, order, n)) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        slot_t *s = slot_of(groups[i], h0[i], h1[i]);
        int64_t *tokens = !s ? NULL : s->index == window ? &s->count :
                          s->index == window + 1 ? &s->previous : NULL;
        if (tokens) *tokens = *tokens + delta > 0 ? *tokens + delta : 0;
    }
    unlock_all(order, n);
    Py_RETURN_NONE;
}

/* Stream slots (budget.py's `acquire`/`release`): each worker counts the streams it
 * holds of a bucket in its own slot, ("stream", bucket, worker), tagged with its
 * incarnation; a bucket's streams are the sum of its workers' slots of their current
 * incarnations, so a worker that died holding some (and is started again, `join`)
 * holds none, and nothing waits for a lease to run out. */

/* join(worker, workers) -> the new incarnation of `worker` (of `workers`). */
static PyObject *Counters_join(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "join(worker, workers)");
        return NULL;
    }
    Py_ssize_t worker = PyLong_AsSsize_t(args[0]), workers = PyLong_AsSsize_t(args[1]);
    if (PyErr_Occurred()) return NULL;
    if (!c->table) {
        PyErr_SetString(PyExc_ValueError, "stream slots need a shared table");
        return NULL;
    }
    if (workers < 1 || workers > MAX_WORKERS || worker < 0 || worker >= workers) {
        PyErr_Format(PyExc_ValueError, "worker %zd of %zd: the table holds the streams of "
                     "at most %d workers", worker, workers, MAX_WORKERS);
        return NULL;
    }
    c->worker = worker;
    c->workers = workers;
    c->epoch = __atomic_add_fetch(&c->table->epochs[worker], 1, __ATOMIC_SEQ_CST);
    return PyLong_FromUnsignedLongLong(c->epoch);
}

/* The streams slot `s` holds now (0: none, another kind, or an earlier incarnation's). */
static int64_t streams_in(const Counters *c, const slot_t *s) {
    return s && s->algorithm == STREAM && !stale(c, s) ? s->count : 0;
}

/* A set of keys' groups, sums and the order to unlock them in. */
typedef struct {
    group_t **groups, **order;
    uint64_t *h0, *h1;
} keyset_t;

static void keyset_free(keyset_t *k) {
    PyMem_Free(k->groups);
    PyMem_Free(k->order);
    PyMem_Free(k->h0);
    PyMem_Free(k->h1);
}

/* `buckets`' stream keys of every worker (`all`: bucket-major) or of this one, locked,
 * in `k` (free it with `keyset_free`): the count of keys, -1 with an exception. */
static Py_ssize_t lock_streams(Counters *c, PyObject *buckets, int all, keyset_t *k) {
    *k = (keyset_t){0};
    if (!c->workers) {
        PyErr_SetString(PyExc_ValueError, "stream slots need `join` first");
        return -1;
    }
    Py_ssize_t first = all ? 0 : c->worker, count = all ? c->workers : 1;
    size_t most = (size_t)MAX_BUCKETS * (size_t)count;
    k->groups = PyMem_Malloc(most * sizeof *k->groups);
    k->order = PyMem_Malloc(most * sizeof *k->order);
    k->h0 = PyMem_Malloc(most * sizeof *k->h0);
    k->h1 = PyMem_Malloc(most * sizeof *k->h1);
    if (!k->groups || !k->order || !k->h0 || !k->h1) {
        keyset_free(k);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t n = keys_of(c, c->stream_tag, buckets, first, count, k->groups, k->h0, k->h1);
    if (n < 0 || lock_all(c, k->groups, k->order, n)) {
        keyset_free(k);
        return -1;
    }
    return n;
}

/* acquire(buckets, caps) -> the index of the first bucket whose workers hold its cap
 * of streams already, or None once this worker took a slot of each. */
static PyObject *Counters_acquire(Counters *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[0]) ||
            PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError, "acquire(buckets, caps: lists, one cap a bucket)");
        return NULL;
    }
    keyset_t k;
    Py_ssize_t n = lock_streams(c, args[0], 1, &k), per = c->workers;
    if (n < 0) return NULL;
    PyObject *out = NULL;
    Py_ssize_t buckets = n / per;
    for (Py_ssize_t b = 0; b < buckets && !out; b++) {
        long long cap = PyLong_AsLongLong(PyList_GET_ITEM(args[1], b));
        if (cap == -1 && PyErr_Occurred()) goto done;
        int64_t held = 0;
        for (Py_ssize_t w = 0; w < per; w++) {
            Py_ssize_t i = b * per + w;
            held += streams_in(c, slot_of(k.groups[i], k.h0[i], k.h1[i]));
        }
        if (held >= cap) out = PyLong_FromSsize_t(b);
    }
    if (out) goto done;
    for (Py_ssize_t b = 0; b < buckets; b++) {
        Py_ssize_t i = b * per + c->worker;
        slot_t *s = slot_of(k.groups[i], k.h0[i], k.h1[i]);
        int64_t held = streams_in(c, s);
        if (!s) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);  /* epoch seconds, as the windows' */
            s = claim(c, k.groups[i], (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
        }
        *s = (slot_t){.h0 = k.h0[i], .h1 = k.h1[i], .algorithm = STREAM, .count = held + 1,
                      .previous = c->worker, .index = (int64_t)c->epoch, .expires = INFINITY};
    }
    out = Py_NewRef(Py_None);
done:
    unlock_all(k.order, n);
    keyset_free(&k);
    return out;
}

/* release(buckets): give back one of this worker's slots of each. */
static PyObject *Counters_release(Counters *c, PyObject *buckets) {
    keyset_t k;
    Py_ssize_t n = lock_streams(c, buckets, 0, &k);
    if (n < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        slot_t *s = slot_of(k.groups[i], k.h0[i], k.h1[i]);
        if (streams_in(c, s) > 0 && --s->count == 0)
            s->expires = -INFINITY;  /* free for another key */
    }
    unlock_all(k.order, n);
    keyset_free(&k);
    Py_RETURN_NONE;
}

static PyObject *Counters_get_table(Counters *c, void *closure) {
    (void)closure;
    return Py_NewRef(c->path ? c->path : Py_None);
}

/* The table's counts (`evictions`, `recovered`), or None without a table. */
static PyObject *Counters_get_table_stats(Counters *c, void *closure) {
    (void)closure;
    if (!c->table) Py_RETURN_NONE;
    return Py_BuildValue("{sKsKsI}", "evictions",
                         (unsigned long long)__atomic_load_n(&c->table->evictions,
                                                             __ATOMIC_RELAXED),
                         "recovered",
                         (unsigned long long)__atomic_load_n(&c->table->recovered,
                                                             __ATOMIC_RELAXED),
                         "groups", c->table->groups);
}

/* _hold(key): lock `key`'s group and keep it locked (tests: a process that dies
 * holding one). */
static PyObject *Counters_hold(Counters *c, PyObject *key) {
    uint64_t h0, h1;
    if (!c->table) {
        PyErr_SetString(PyExc_ValueError, "no shared table");
        return NULL;
    }
    return lock_key(c, key, &h0, &h1) ? Py_NewRef(Py_None) : NULL;
}
