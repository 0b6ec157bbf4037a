/*
 * The native lane's route matching (part of lane.c, included by it: one translation
 * unit; `runtime.net.lane` hashes this file into the build's key): which of the lane's
 * routes serves a path, as the Router picks it (`find_route`), with what runtime/
 * pipeline/lane.py found another route takes there (`excluded`) and what a pattern
 * captured (`matches`).
 */
/* Segment `i` (from 0) of `path` (n bytes, starting with '/'): its start; its length in
 * *len; NULL when the path has fewer. */
static const char *segment(const char *path, size_t n, long i, size_t *len) {
    size_t at = 0;
    for (; i >= 0; i--) {
        if (at >= n || path[at] != '/') return NULL;
        size_t end = ++at;
        while (end < n && path[end] != '/') end++;
        if (i == 0) { *len = end - at; return path + at; }
        at = end;
    }
    return NULL;
}

/* Whether `path` (n bytes, under prefix route or matching pattern route `r`) is one of
 * `r`'s exclusions. */
static int excluded(const route_t *r, const char *path, size_t n) {
    if (!r->excluded) return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r->excluded); i++) {
        PyObject *x = PyTuple_GET_ITEM(r->excluded, i);  /* checked by `routes` */
        PyObject *p = PyTuple_GET_ITEM(x, 0);
        size_t m = (size_t)PyBytes_GET_SIZE(p), len;
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(x, 1));
        if (kind >= EX_SEGMENT) {  /* ":" (no literal segment is one): any non-empty */
            const char *seg = segment(path, n, kind - EX_SEGMENT, &len);
            int any = m == 1 && PyBytes_AS_STRING(p)[0] == ':';
            if (seg && (any ? len > 0 : len == m && !memcmp(seg, PyBytes_AS_STRING(p), m)))
                return 1;
            continue;
        }
        if (n < m || memcmp(path, PyBytes_AS_STRING(p), m)) continue;
        if (kind == EX_PREFIX || n == m || (kind == EX_TREE && path[m] == '/')) return 1;
    }
    return 0;
}

/* Whether `path` (n bytes) matches pattern route `r` as the Router's regex does (a
 * literal segment equal, a capture one non-empty segment, then the end or a '/'), its
 * captures into `q`; a final `*`'s: what follows that '/' (empty at the end). */
static int matches(const route_t *r, const char *path, size_t n, req_t *q) {
    size_t at = 0;
    q->ncaps = 0;
    for (uint32_t i = 0; i < r->nseg; i++) {
        if (at >= n || path[at] != '/') return 0;
        size_t start = ++at;
        while (at < n && path[at] != '/') at++;
        size_t len = at - start;
        if (r->seg[i].capture) {
            if (!len) return 0;
            q->caps[q->ncaps].at = (uint32_t)start;
            q->caps[q->ncaps++].len = (uint32_t)len;
        } else if (len != r->seg[i].len || memcmp(path + start, r->path + r->seg[i].at, len)) {
            return 0;
        }
    }
    if (at < n && path[at] != '/') return 0;
    q->rest_at = at < n ? (uint32_t)at + 1 : (uint32_t)n;
    q->rest_len = (uint32_t)(n - q->rest_at);
    return 1;
}

/* The route serving `path` (n bytes): the one equal to it, else the prefix route it lies
 * under (a segment boundary: "/a" serves "/a/x", not "/ax"; "/" every path) that does
 * not exclude it, as the Router picks it (a prefix route excludes the subtrees of the
 * routes under it: at most one takes a path); -1: none of the lane's. */
static int find_route(const Lane *l, const char *path, size_t n, req_t *q) {
    q->ncaps = 0;
    for (int i = 0; i < l->n_routes; i++)
        if (!l->routes[i].pattern && l->routes[i].path_len == n &&
                !memcmp(l->routes[i].path, path, n))
            return i;
    for (int i = 0; i < l->n_routes; i++) {
        const route_t *r = &l->routes[i];
        if (r->prefix && r->path_len < n && !memcmp(r->path, path, r->path_len) &&
                (r->path_len == 1 || path[r->path_len] == '/') && !excluded(r, path, n))
            return i;
    }
    for (int i = 0; i < l->n_routes; i++) {  /* a pattern's: what Python found it alone on */
        const route_t *r = &l->routes[i];
        if (r->pattern && matches(r, path, n, q) && !excluded(r, path, n)) return i;
    }
    q->ncaps = 0;
    return -1;
}
