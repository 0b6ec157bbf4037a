/*
 * edgefn guest SDK for C (reactor ABI, no libc needed).
 *
 * Define `int64_t handle(const edgefn_request *req)` and return one of the
 * edgefn_respond* helpers. Build (see functions/examples/counter-c/build.sh):
 *   clang --target=wasm32 -O2 -nostdlib -Wl,--no-entry -Wl,--strip-all \
 *         -Wl,--allow-undefined -o fn.wasm fn.c
 * Host functions (KV, vectors) are imported from the "edgefn" module; a call the
 * manifest did not declare traps with the reason.
 *
 * Route captures: for a route `/users/:id` with a last segment `*`,
 * `edgefn_param(req, "id")` is the captured segment and `edgefn_param(req, "*")`
 * the rest of the path, both as raw as `req->path` (still percent-encoded);
 * {0, 0} when absent. They come in the request's params section, after the body
 * (README "Guest ABI"); a request that ends right after the body has none.
 *
 * The caller: `edgefn_principal(req, "tenant")` (also "kind", "key_id", "subject",
 * "scopes", "bot", "agent"), from the principal section after the params; {0, 0}
 * for an anonymous caller.
 */
#ifndef EDGEFN_H
#define EDGEFN_H
#include <stddef.h>
#include <stdint.h>

#define EDGEFN_IMPORT(n) __attribute__((import_module("edgefn"), import_name(n)))
#define EDGEFN_EXPORT(n) __attribute__((export_name(n)))

EDGEFN_IMPORT("kv_get") int64_t edgefn_kv_get(const char *ns, int32_t ns_len, const char *key,
                                              int32_t key_len, void *buf, int32_t cap);
EDGEFN_IMPORT("kv_put") int64_t edgefn_kv_put(const char *ns, int32_t ns_len, const char *key,
                                              int32_t key_len, const void *val, int32_t val_len);
EDGEFN_IMPORT("kv_delete") int32_t edgefn_kv_delete(const char *ns, int32_t ns_len,
                                                    const char *key, int32_t key_len);
EDGEFN_IMPORT("kv_increment") int64_t edgefn_kv_increment(const char *ns, int32_t ns_len,
                                                          const char *key, int32_t key_len,
                                                          int64_t delta);
EDGEFN_IMPORT("call") int64_t edgefn_call(const char *name, int32_t name_len, const char *args,
                                          int32_t args_len, void *buf, int32_t cap);

typedef struct { const char *ptr; uint32_t len; } edgefn_str;

typedef struct {
    edgefn_str method, path, query, body;
    uint32_t n_headers, n_env, n_params, n_principal;
    /* (u32 len, bytes) pairs, README "Guest ABI" */
    const uint8_t *headers, *env, *params, *principal;
} edgefn_request;

/* -- memory: a bump allocator (every request gets a fresh instance) ------------------------ */
extern unsigned char __heap_base;
static uintptr_t edgefn__top;

void *memcpy(void *dst, const void *src, size_t n) {
    unsigned char *d = dst; const unsigned char *s = src;
    while (n--) *d++ = *s++;
    return dst;
}

void *memset(void *dst, int c, size_t n) {
    unsigned char *d = dst;
    while (n--) *d++ = (unsigned char)c;
    return dst;
}

EDGEFN_EXPORT("edgefn_alloc") int32_t edgefn_alloc(int32_t n) {
    if (!edgefn__top) edgefn__top = (uintptr_t)&__heap_base;
    uintptr_t p = (edgefn__top + 7) & ~(uintptr_t)7;
    uintptr_t end = p + (uint32_t)n;
    uintptr_t have = __builtin_wasm_memory_size(0) * 65536u;
    if (end > have && __builtin_wasm_memory_grow(0, (end - have + 65535) / 65536) == (size_t)-1)
        __builtin_trap();
    edgefn__top = end;
    return (int32_t)p;
}

/* -- strings ------------------------------------------------------------------------------- */
static inline uint32_t edgefn_strlen(const char *s) { uint32_t n = 0; while (s[n]) n++; return n; }
static inline edgefn_str edgefn_cstr(const char *s) { edgefn_str r = {s, edgefn_strlen(s)}; return r; }
static inline int edgefn_eq(edgefn_str a, const char *b) {
    uint32_t n = edgefn_strlen(b);
    if (a.len != n) return 0;
    for (uint32_t i = 0; i < n; i++) if (a.ptr[i] != b[i]) return 0;
    return 1;
}
/* Decimal text of v into buf (at least 21 bytes); returns its length. */
static inline uint32_t edgefn_itoa(int64_t v, char *buf) {
    char tmp[21]; uint32_t n = 0, i = 0;
    uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) buf[i++] = '-';
    while (n) buf[i++] = tmp[--n];
    return i;
}
int32_t edgefn_alloc(int32_t n);

/* Gives back the block edgefn_alloc returned last, (p, n): the next allocation reuses it. */
static inline void edgefn__free_last(void *p, int32_t n) {
    if ((uintptr_t)p + (uint32_t)n == edgefn__top) edgefn__top = (uintptr_t)p;
}

/* Calls a host function that fills (buf, cap) and returns the full length (-1: none):
 * first with a 4 KiB buffer, then, while the length it reports is more than the buffer
 * holds, again with a buffer of that length (the value may have grown in between, or
 * be gone: another writer). A length that changed on each of EDGEFN__TRIES calls, or
 * one no buffer can have, traps (unreachable). */
#define EDGEFN__TRIES 8
typedef int64_t (*edgefn__filler)(const char *, int32_t, const char *, int32_t, void *, int32_t);
static inline edgefn_str edgefn__fetch(edgefn__filler f, const char *a, int32_t a_len,
                                       const char *b, int32_t b_len) {
    edgefn_str s = {0, 0};
    int32_t cap = 4096;
    char *buf = (char *)(uintptr_t)edgefn_alloc(cap);
    for (int tries = 1;; tries++) {
        int64_t n = f(a, a_len, b, b_len, buf, cap);
        if (n < 0) return s;
        if (n <= cap) { s.ptr = buf; s.len = (uint32_t)n; return s; }
        if (tries == EDGEFN__TRIES || n > INT32_MAX) __builtin_trap();
        edgefn__free_last(buf, cap);
        cap = (int32_t)n;
        buf = (char *)(uintptr_t)edgefn_alloc(cap);
    }
}

/* A KV value, or {0, 0} if absent. */
static inline edgefn_str edgefn_kv_get_str(const char *ns, int32_t ns_len, const char *key,
                                           int32_t key_len) {
    return edgefn__fetch(edgefn_kv_get, ns, ns_len, key, key_len);
}

/* A binding call ("vectors.query", ...) with JSON args; its JSON result. */
static inline edgefn_str edgefn_call_str(const char *name, int32_t name_len, const char *args,
                                         int32_t args_len) {
    return edgefn__fetch(edgefn_call, name, name_len, args, args_len);
}

/* -- request ------------------------------------------------------------------------------- */
static inline uint32_t edgefn__u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static const uint8_t *edgefn__str(const uint8_t *p, edgefn_str *out) {
    out->len = edgefn__u32(p); out->ptr = (const char *)p + 4; return p + 4 + out->len;
}
static const uint8_t *edgefn__pairs(const uint8_t *p, uint32_t *count, const uint8_t **start) {
    edgefn_str s;
    *count = edgefn__u32(p); p += 4; *start = p;
    for (uint32_t i = 0; i < 2 * *count; i++) p = edgefn__str(p, &s);
    return p;
}
/* The first value of `name` among (name, value) pairs (headers: lower-case names). */
static inline edgefn_str edgefn_lookup(const uint8_t *pairs, uint32_t count, const char *name) {
    edgefn_str k, v, none = {0, 0};
    for (uint32_t i = 0; i < count; i++) {
        pairs = edgefn__str(edgefn__str(pairs, &k), &v);
        if (edgefn_eq(k, name)) return v;
    }
    return none;
}
#define edgefn_header(req, name) edgefn_lookup((req)->headers, (req)->n_headers, (name))
#define edgefn_env(req, name) edgefn_lookup((req)->env, (req)->n_env, (name))
#define edgefn_param(req, name) edgefn_lookup((req)->params, (req)->n_params, (name))
#define edgefn_principal(req, name) \
    edgefn_lookup((req)->principal, (req)->n_principal, (name))

/* -- response ------------------------------------------------------------------------------ */
static inline uint8_t *edgefn__put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
    return p + 4;
}
static inline uint8_t *edgefn__putstr(uint8_t *p, const void *s, uint32_t n) {
    p = edgefn__put32(p, n); memcpy(p, s, n); return p + n;
}
/* A response with one content-type header; returns what edgefn_handle must return. */
static inline int64_t edgefn_respond(uint32_t status, const char *content_type, const void *body,
                                     uint32_t len) {
    uint32_t ct = edgefn_strlen(content_type);
    uint8_t *out = (uint8_t *)(uintptr_t)edgefn_alloc((int32_t)(8 + 16 + 12 + ct + len));
    uint8_t *p = edgefn__put32(edgefn__put32(out, status), 1);
    p = edgefn__putstr(p, "content-type", 12);
    p = edgefn__putstr(p, content_type, ct);
    p = edgefn__putstr(p, body, len);
    return (int64_t)((uint64_t)(uintptr_t)out << 32 | (uint32_t)(p - out));
}

int64_t handle(const edgefn_request *req);

EDGEFN_EXPORT("edgefn_handle") int64_t edgefn_handle(int32_t ptr, int32_t len) {
    const uint8_t *p = (const uint8_t *)(uintptr_t)ptr + 4; /* skip "EFQ1" */
    const uint8_t *end = (const uint8_t *)(uintptr_t)ptr + (uint32_t)len;
    edgefn_request r;
    p = edgefn__str(p, &r.method);
    p = edgefn__str(p, &r.path);
    p = edgefn__str(p, &r.query);
    p = edgefn__pairs(p, &r.n_headers, &r.headers);
    p = edgefn__pairs(p, &r.n_env, &r.env);
    p = edgefn__str(p, &r.body);
    r.n_params = r.n_principal = 0;
    r.params = r.principal = p;
    if (end - p >= 4) p = edgefn__pairs(p, &r.n_params, &r.params); /* absent: no params */
    if (end - p >= 4) edgefn__pairs(p, &r.n_principal, &r.principal); /* anonymous: none */
    return handle(&r);
}
#endif
