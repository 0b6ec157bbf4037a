/*
 * The native lane (`_edgefn_lane`, runtime/net/lane.py): whole requests for the
 * targets Python found eligible, served in C from the bytes one read brought.
 *
 * `Lane.serve(data, ...)` parses `data` from a message boundary with llhttp (the
 * one httptools ships: its C API is dlsym'd from httptools' own extension, the
 * struct layout below is llhttp 9.x's public header, checked at load by
 * `layout_check()` against llhttp's own accessors). For each complete request it
 * decides whether it is one the lane serves exactly as the Python front and
 * pipeline would: HTTP/1.1 or 1.0 (kept alive, or not: then answered with
 * `connection: close`, the last it serves on the connection: `closing`) GET or HEAD
 * without a body, or POST, PUT, PATCH or DELETE
 * with no body or one framed by Content-Length and whole in the read (up to
 * `max_body`; one whose body is still to come, `held`, the front keeps until it is,
 * then serves again), no header that any stage or the
 * front reads differently (Connection, Expect, Upgrade, chunked framing,
 * credentials, signatures, x-edgefn-*; a caller's request id is kept as
 * `request_id` keeps it: `kept_id`), a plain origin-form path that
 * equals an eligible route, lies under one or matches one with captures (or a final
 * `*`) where the
 * Router picks it (`find_route`: Python lists what another route takes there),
 * a User-Agent Python has classified as a
 * non-browser class its policy allows, sizes under the front's limits. If so:
 * encode the request (edgefn_core/abi.py), call the PoP's own reactor entry
 * (reactor.c `edgefn_reactor_call`, passed in as a pointer; the GIL released as
 * the PoP's `serve` does), check the guest's frame as abi.decode_response does,
 * and write the response the front would write. For a Python route (a Python
 * function's, or a WASI command's) it encodes the request the same way and hands it
 * to Python's `submit` (one call: the function's pool runs it, or the command runs as
 * dispatch runs it) and stops: the connection has a response in progress; `respond`
 * writes the answer once it is back (or Python finishes it).
 * Anything else, and everything after it in `data`, is left to Python (`serve`
 * says how many bytes it used): the lane never answers an error, Python's own
 * code does.
 *
 * Each request it answers leaves one record (`add_record`); `EventMaker.make` turns a
 * loop turn's records into their events, access-log lines and metric groups
 * (runtime/pipeline/lane.py `NativeLane.drain`).
 *
 * Parts it includes (one translation unit; `runtime.net.lane.PARTS` hash them into the
 * build's key): lane_routes.c.h (which route serves a path), lane_records.c.h (what it
 * answered, packed until read), lane_cgi.c.h (WASI commands run here), lane_drain.c.h
 * (records into events, log lines, metric groups).
 *
 * Every read is bounded: the parse buffers are fixed (URL_MAX, HEAD_MAX,
 * MAX_HEADERS; past them the request goes to Python), the guest's frame is
 * walked with every length checked against what remains. Loop thread only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- llhttp 9.x ------------------------------------------------------------------------ */
typedef struct llhttp_s llhttp_t;
typedef int (*llhttp_data_cb)(llhttp_t *, const char *, size_t);
typedef int (*llhttp_cb)(llhttp_t *);
struct llhttp_s {
    int32_t _index;
    void *_span_pos0;
    void *_span_cb0;
    int32_t error;
    const char *reason;
    const char *error_pos;
    void *data;
    void *_current;
    uint64_t content_length;
    uint8_t type, method, http_major, http_minor, header_state;
    uint16_t lenient_flags;
    uint8_t upgrade, finish;
    uint16_t flags, status_code;
    uint8_t initial_message_completed;
    void *settings;
};
_Static_assert(offsetof(llhttp_t, data) == 0x30, "llhttp data");
_Static_assert(offsetof(llhttp_t, method) == 0x49, "llhttp method");
_Static_assert(offsetof(llhttp_t, http_minor) == 0x4b, "llhttp http_minor");
_Static_assert(sizeof(llhttp_t) == 96, "llhttp size");

typedef struct {
    llhttp_cb on_message_begin;
    llhttp_data_cb on_protocol, on_url, on_status, on_method, on_version, on_header_field,
        on_header_value, on_chunk_extension_name, on_chunk_extension_value;
    llhttp_cb on_headers_complete;
    llhttp_data_cb on_body;
    llhttp_cb on_message_complete, on_protocol_complete, on_url_complete, on_status_complete,
        on_method_complete, on_version_complete, on_header_field_complete,
        on_header_value_complete, on_chunk_extension_name_complete,
        on_chunk_extension_value_complete, on_chunk_header, on_chunk_complete, on_reset;
} llhttp_settings_t;
_Static_assert(offsetof(llhttp_settings_t, on_url) == 0x10, "settings on_url");
_Static_assert(offsetof(llhttp_settings_t, on_header_value) == 0x38, "settings value");
_Static_assert(offsetof(llhttp_settings_t, on_headers_complete) == 0x50, "settings hc");
_Static_assert(offsetof(llhttp_settings_t, on_message_complete) == 0x60, "settings mc");
_Static_assert(offsetof(llhttp_settings_t, on_reset) == 0xc0, "settings reset");

enum { HPE_OK = 0, HPE_PAUSED = 21, HTTP_REQUEST = 1 };
enum { F_CHUNKED = 1 << 3, F_CONTENT_LENGTH = 1 << 5, F_TRANSFER_ENCODING = 1 << 9 };  /* flags */
enum { M_DELETE = 0, M_GET = 1, M_HEAD = 2, M_POST = 3, M_PUT = 4, M_PATCH = 28 };  /* llhttp's */
/* The methods the lane serves, as its records, calls and groups name them (METHODS);
 * from MC_POST on, the unsafe ones: a body may come, http_cache bypasses them */
enum { MC_GET = 0, MC_HEAD = 1, MC_POST = 2, MC_PUT = 3, MC_PATCH = 4, MC_DELETE = 5,
       N_METHODS = 6 };
static const char *const METHOD_NAMES[N_METHODS] = {"GET", "HEAD", "POST", "PUT", "PATCH",
                                                     "DELETE"};

/* llhttp's method `m` as the lane's MC_* code, or -1 (a method the lane leaves) */
static int method_code(uint8_t m) {
    switch (m) {
        case M_GET: return MC_GET;
        case M_HEAD: return MC_HEAD;
        case M_POST: return MC_POST;
        case M_PUT: return MC_PUT;
        case M_PATCH: return MC_PATCH;
        case M_DELETE: return MC_DELETE;
        default: return -1;
    }
}
#define BODY_MAX ((uint64_t)1 << 20)  /* a larger body is Python's, whatever max_body says */

static void (*ll_init)(llhttp_t *, int, const llhttp_settings_t *);
static void (*ll_settings_init)(llhttp_settings_t *);
static int (*ll_execute)(llhttp_t *, const char *, size_t);
static void (*ll_resume)(llhttp_t *);
static const char *(*ll_error_pos)(const llhttp_t *);
static int (*ll_should_keep_alive)(const llhttp_t *);
static uint8_t (*ll_get_method)(llhttp_t *);
static uint8_t (*ll_get_http_major)(llhttp_t *);
static uint8_t (*ll_get_http_minor)(llhttp_t *);
static llhttp_settings_t SETTINGS;

/* ---- the PoP's reactor entry (runtime/executors/wasm/native_src/reactor.c) ------------- */
typedef struct {
    int32_t stage;
    int32_t export_index;
    void *trap;
    void *error;
    uint64_t a, b;
    uint64_t memory_size;
    const uint8_t *response;
    uint64_t response_len;
} edgefn_result;
typedef void (*delete_t)(void *);  /* wasm_trap_delete, wasmtime_error_delete */
typedef int32_t (*reactor_call_t)(void *engine, const void *pre, int64_t memory_limit,
                                  uint64_t deadline_ticks, const uint8_t *req, size_t req_len,
                                  uint64_t max_response, int32_t handle, edgefn_result *r,
                                  void *times);

/* ---- a WASI command's run (runtime/executors/wasm/native_src/wasi.c) -------------------- */
typedef struct {
    int32_t stage, overflow;
    void *trap, *error;
    uint64_t memory_size;
    const uint8_t *out;
    uint64_t out_len;
    const uint8_t *err;
    uint64_t err_len, err_dropped;
} wasi_result;
typedef int32_t (*wasi_run_t)(void *engine, const void *pre, int64_t memory_limit,
                              uint64_t ticks, const char *strings, size_t strings_len,
                              size_t argc, size_t envc, const uint8_t *in, size_t in_len,
                              uint64_t limit, wasi_result *r);
typedef void (*guest_mark_t)(void);  /* reactor.c's edgefn_guest_begin / _end */
enum { WASI_RUN_OK = 0 };  /* wasi.c's RUN_OK: `_start` returned (or exited 0) */

/* ---- one request being parsed ---------------------------------------------------------- */
#define URL_MAX 4096
#define HEAD_MAX 8192
#define MAX_HEADERS 64
#define UA_MAX 512
#define MAX_ROUTES 256
#define MAX_SEGMENTS 16  /* of a pattern route the lane serves (Python checks) */
#define UA_SLOTS 1024  /* a power of two */
#define MAX_HEAD_BYTES (64 << 10)  /* edgefn_core.abi.MAX_HEAD_BYTES */
#define MAX_HEAD_FIELDS 4096       /* edgefn_core.abi.MAX_HEAD_FIELDS */

typedef struct { uint32_t name, name_len, value, value_len; } hdr_t;

typedef struct {
    int done;      /* on_message_complete ran */
    int headed;    /* on_headers_complete ran (its checks passed) */
    int bad;       /* not one the lane serves */
    int hstate;    /* 0: none yet, 1: in a field, 2: in a value */
    uint32_t url_len, head_len, nh;
    uint64_t py_head;  /* the front's measure: sum of name + value + 4 */
    const char *body;  /* an unsafe method's body: a span of the read's bytes (one: */
    uint64_t body_len; /* Content-Length framing), at most max_body */
    uint64_t max_body; /* min(the front's max_body_bytes, BODY_MAX); 0: no bodies */
    int http10;        /* an HTTP/1.0 request */
    int close;         /* not kept alive (`Connection: close`, 1.0's default): its answer
                        * says `connection: close`, and the connection closes after it */
    int sub;           /* its path is under its route's (a prefix's), not the route's own */
    uint32_t ncaps;    /* what a pattern route captured: spans of `url` */
    struct { uint32_t at, len; } caps[MAX_SEGMENTS];
    uint32_t rest_at, rest_len;  /* what a final `*` captured: a span of `url` */
    uint32_t path_len; /* of `url`, before any '?' */
    const char *rid;   /* the caller's request id `request_id` keeps (in `head`), or NULL */
    uint32_t rid_len;
    int judged;        /* its verdict is found (`verdict`: `request_verdict`'s) */
    int verdict;
    hdr_t h[MAX_HEADERS];
    char url[URL_MAX];
    char head[HEAD_MAX];
} req_t;

static int on_message_begin(llhttp_t *p) {
    req_t *q = p->data;
    q->done = q->bad = q->hstate = q->headed = q->judged = 0;
    q->url_len = q->head_len = q->nh = 0;
    q->py_head = 0;
    q->body = NULL;
    q->body_len = 0;
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    req_t *q = p->data;
    if (n > URL_MAX - q->url_len) { q->bad = 1; return -1; }
    memcpy(q->url + q->url_len, at, n);
    q->url_len += (uint32_t)n;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    req_t *q = p->data;
    if (n > HEAD_MAX - q->head_len) { q->bad = 1; return -1; }
    if (q->hstate != 1) {
        if (q->nh == MAX_HEADERS) { q->bad = 1; return -1; }
        hdr_t *h = &q->h[q->nh++];
        h->name = q->head_len;
        h->name_len = h->value = h->value_len = 0;
        q->hstate = 1;
        q->py_head += 4;  /* the front counts each field's name and value + 4 */
    }
    char *o = q->head + q->head_len;
    for (size_t i = 0; i < n; i++)
        o[i] = (char)(at[i] >= 'A' && at[i] <= 'Z' ? at[i] + 32 : at[i]);
    q->head_len += (uint32_t)n;
    q->h[q->nh - 1].name_len += (uint32_t)n;
    q->py_head += n;
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    req_t *q = p->data;
    if (n > HEAD_MAX - q->head_len || q->nh == 0) { q->bad = 1; return -1; }
    hdr_t *h = &q->h[q->nh - 1];
    if (q->hstate != 2) { h->value = q->head_len; q->hstate = 2; }
    memcpy(q->head + q->head_len, at, n);
    q->head_len += (uint32_t)n;
    h->value_len += (uint32_t)n;
    q->py_head += n;
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    req_t *q = p->data;
    if (q->hstate == 1) { q->bad = 1; return -1; }  /* a field without a value */
    for (uint32_t i = 0; i < q->nh; i++) {  /* llhttp keeps a value's trailing SP/HTAB: */
        hdr_t *h = &q->h[i];  /* trimmed, as the front's `on_header` does (RFC 9110 5.5) */
        while (h->value_len && (q->head[h->value + h->value_len - 1] == ' ' ||
                                q->head[h->value + h->value_len - 1] == '\t'))
            h->value_len--;
    }
    if (p->http_major != 1 || p->http_minor > 1 || method_code(p->method) < 0) {
        q->bad = 1;
        return -1;
    }
    q->http10 = p->http_minor == 0;
    q->headed = 1;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    req_t *q = p->data;
    if (method_code(p->method) < MC_POST || (q->body && at != q->body + q->body_len) ||
            n > q->max_body - q->body_len) {  /* not one span (chunked), or too large */
        q->bad = 1;
        return -1;
    }
    if (!q->body) q->body = at;
    q->body_len += n;
    return 0;
}

static int on_message_complete(llhttp_t *p) {
    ((req_t *)p->data)->done = 1;
    return HPE_PAUSED;  /* stop right after it: its end is llhttp_get_error_pos */
}

/* ---- the lane -------------------------------------------------------------------------- */
typedef struct {
    char path[256];
    size_t path_len;
    void *engine, *pre, *times;
    int64_t memory_limit;
    uint64_t deadline_ticks, max_response;
    PyObject *env_blob, *label, *fn;  /* bytes, bytes, the Deployment (its `inflight`) */
    uint32_t allowed;                  /* bit per bot class whose action is "allow" */
    int cache;                         /* CACHE_*: what http_cache does for it */
    int origin;                        /* a request with an Origin header is Python's (a
                                        * `cors` stage acts on it: its paths hold this) */
    int prefix;                        /* it also serves the paths under it ("/a" serves
                                        * "/a/x", "/" every path) but `excluded`'s */
    int pattern;                       /* a route with captures ("/users/:id") or a final
                                        * wildcard ("/files/*"): `path` is it as written,
                                        * split into `seg` (a capture's name after its
                                        * ':'; the `*` not among them: `wildcard`) */
    int wildcard;                      /* it ends in `*`: the rest of the path is a param */
    int limited;                       /* ratelimit counts its requests (`limit_admits`) */
    int refuses;                       /* ...and the lane writes the 429 it refuses with */
    uint32_t blocked;                  /* bit per bot class whose action is "block", where
                                        * the lane writes bots' 403 (`block`) */
    PyObject *guard;                   /* a function that asks for a credential: auth's
                                        * 401 to a request without one (`refuse` takes
                                        * it), one with one being Python's; or NULL */
    int guard_counts;                  /* ratelimit counts that refusal (`guard_ask`) */
    uint32_t nseg;
    struct { uint32_t at, len; int capture; } seg[MAX_SEGMENTS];
    PyObject *excluded;                /* tuple of (path bytes, EX_*): paths under it the
                                        * Router gives another target (Python's `_under`),
                                        * or NULL */
    PyObject *caching, *label_str;     /* the HTTP cache's labels with entries; its label */
    PyObject *executor;                /* its WasmFunction (`threaded`: moved off the loop) */
    PyObject *python;                  /* a Python function's route: what `submit` and the
                                        * Python finish read of it; NULL for WASM */
    PyObject *cgi;                     /* a WASI command the C may run itself (else NULL):
                                        * argv[0] and its manifest env, NUL-ended strings */
    uint32_t cgi_envc;                 /* the env's pairs in `cgi` */
    PyObject *cgi_route;               /* bytes: X_MATCHED_ROUTE */
} route_t;

/* a route's flags (its tuple's `origin` field) */
enum { ROUTE_ORIGIN = 1, ROUTE_PREFIX = 2, ROUTE_PATTERN = 4, ROUTE_LIMITED = 8,
       ROUTE_REFUSES = 16, ROUTE_GUARD_COUNTS = 32 };
/* an exclusion under a prefix route: that path; it and the paths under it; every path
 * it starts (runtime/pipeline/lane_table.py EXCLUDE_*) */
enum { EX_PATH = 0, EX_TREE = 1, EX_PREFIX = 2, EX_SEGMENT = 3 };
/* (EX_SEGMENT + i: a path whose segment i, from 0, is that literal; ":" any non-empty) */

/* http_cache for a route: not in its plan; off for the function; nothing of the deployment stored (`_first`: MISS, unless the response
 * says it may be stored, which Python does) */
enum { CACHE_NONE = 0, CACHE_OFF = 1, CACHE_FIRST = 2 };

/* A User-Agent's verdict: one index, or for a browser's (`browser`) the four its other
 * headers choose from (`browser_verdict`), with the Chrome major version it claims and
 * whether it sends Sec-Fetch-* (`UaView`) */
typedef struct {
    PyObject *ua;
    int verdict;
    int browser, sec_fetch;
    int of[4];  /* BV_*: browser, headers missing, no Sec-Fetch-Mode, hints mismatch */
    long chrome;
} ua_slot;
enum { BV_BROWSER, BV_MISSING, BV_NO_SEC_FETCH, BV_HINTS, N_BV };

typedef struct {
    PyObject_HEAD
    reactor_call_t call;
    delete_t trap_delete, error_delete;  /* what a failed call leaves is the caller's */
    route_t routes[MAX_ROUTES];
    int n_routes;
    PyObject *class_blobs;   /* tuple: the principal blob per bot class */
    PyObject *verdict_class; /* tuple: verdict -> bot class index */
    PyObject *blocks;        /* tuple: verdict -> bots' refusal of it (`block`), or None */
    PyObject *guard_ask;     /* guard_ask(route index, client) -> a refusal: auth's 401,
                              * counted by ratelimit (its 429 where a limit is full) */
    PyObject *classify;      /* classify(ua) -> verdict index, or -1: Python's */
    PyObject *status_lines;  /* tuple of 600: bytes or None */
    PyObject *inflight_name; /* "inflight" */
    PyObject *threaded_name; /* "threaded" */
    PyObject *lane_cut_name; /* "lane_cut" */
    char prefix[64];         /* request id prefix */
    size_t prefix_len;
    char rid_header[64];     /* the request id header, lower case */
    size_t rid_header_len;
    uint64_t counter;        /* the request id counter, shared with `request_id` */
    int trust;               /* `request_id`'s trust_incoming: a caller's id is kept */
    int foreign;             /* a credential that is no edgefn key proves no one here (no
                              * [auth.jwt]): it goes to the function as sent */
    uint64_t max_url, max_head;
    ua_slot uas[UA_SLOTS];
    size_t n_uas;
    edgefn_result result;
    PyObject *submit;        /* submit(route, call) -> future or None: a Python route's call
                              * (`call`: the tuple python_call makes, its future None) */
    PyObject *started;       /* what serve_one started for a Python route, for `serve` */
    wasi_run_t wasi_run;     /* commands(...): the WASI run, the ticker's marks, and */
    guest_mark_t guest_begin, guest_end;
    PyObject *principals;    /* per bot class: "EDGEFN_PRINCIPAL_BOT\0<class>\0" */
    uint8_t *cgi;            /* a command's strings, then its answer as a response frame */
    uint64_t commands_run;   /* requests `command_call` answered */
    size_t cgi_cap;
    uint64_t generation;     /* of the route table: a call names its route by index */
    uint8_t *req;            /* the encoded request */
    size_t req_cap;
    uint8_t *out;            /* responses of one serve() */
    size_t out_len, out_cap;
    PyObject *limit_admits;  /* limiter(admits, count): ratelimit's, for limited routes */
    PyObject *limit_count;
    PyObject *limit_token;   /* what limit_admits said of the request being served */
    PyObject *limit_head;    /* the RateLimit fields limit_count gave it (header lines) */
    uint64_t waiting;        /* the body bytes the request serve stopped at still needs
                              * (`held`), 0 when it is not one the lane waits for */
    int closing;             /* the last request serve took was not kept alive */
    req_t q;
} Lane;

static int grow(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need) {
        if (n > ((size_t)1 << 40)) return -1;
        n *= 2;
    }
    uint8_t *p = realloc(*buf, n);
    if (!p) return -1;
    *buf = p;
    *cap = n;
    return 0;
}

static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

static unsigned char TCHAR[256];

static int name_is(const req_t *q, const hdr_t *h, const char *s, size_t n) {
    return h->name_len == n && !memcmp(q->head + h->name, s, n);
}

/* Whether `v` (n bytes) holds `mark` (m bytes). */
static int has_mark(const char *v, uint32_t n, const char *mark, uint32_t m) {
    for (uint32_t i = 0; i + m <= n; i++)
        if (v[i] == mark[0] && !memcmp(v + i, mark, m)) return 1;
    return 0;
}

/* Whether `v` (n bytes) holds "efn_": what `dispatch` takes out of a function's copy
 * of the request (`_without_keys`), and what any edgefn API key starts with. */
static int has_key_mark(const char *v, uint32_t n) { return has_mark(v, n, "efn_", 4); }

/* Whether `v` (n bytes) is a Basic credential whose base64 holds "efn_" once decoded
 * (a key as either half of it: `dispatch` takes it out of a function's copy too); one
 * that does not decode, or is too long to look at here, is handed over as well. */
static int basic_key_mark(const char *v, uint32_t n) {
    static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    unsigned char out[1536];
    uint32_t len = 0, bits = 0, acc = 0;
    if (n < 6 || strncasecmp(v, "basic", 5) || (v[5] != ' ' && v[5] != '\t')) return 0;
    if (n > 2048) return 1;
    for (uint32_t i = 6; i < n; i++) {
        const char *at;
        if (v[i] == ' ' || v[i] == '\t' || v[i] == '=') continue;
        if (!v[i] || !(at = strchr(B64, v[i]))) return 1;
        acc = (acc << 6) | (uint32_t)(at - B64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (unsigned char)(acc >> bits);
        }
    }
    return has_key_mark((const char *)out, len);
}

/* Headers the lane leaves to Python: the front reads them (framing, Connection but
 * `Connection: keep-alive`, Expect, Upgrade, x-edgefn-warmup), a stage does (a
 * credential that may prove someone: an edgefn key, or any bearer token where
 * [auth.jwt] may verify it; a Web Bot Auth signature, residency's x-edgefn-*), or a
 * function's copy of the request would differ (API keys, and the dashboard's session
 * cookie, are taken out by `dispatch`).
 * A foreign credential (a function's own Basic auth or token) proves no one: auth
 * (mode none) and dispatch leave it, so the lane does. The request id header is
 * `kept_id`'s. */
static int handed_over(const Lane *l, const req_t *q, const hdr_t *h) {
    static const char *NAMES[] = {"connection", "content-length", "transfer-encoding",
                                  "expect", "upgrade", "signature-input", "signature",
                                  "keep-alive", "te", "proxy-connection", "http2-settings"};
    const char *name = q->head + h->name;
    if (name_is(q, h, "authorization", 13) || name_is(q, h, "x-api-key", 9))
        return !l->foreign || has_key_mark(q->head + h->value, h->value_len) ||
               basic_key_mark(q->head + h->value, h->value_len);
    if (h->name_len >= 9 && !memcmp(name, "x-edgefn-", 9)) return 1;
    if (name_is(q, h, "cookie", 6) && has_mark(q->head + h->value, h->value_len, "edgefn_dash", 11))
        return 1;
    for (size_t i = 0; i < sizeof NAMES / sizeof *NAMES; i++)
        if (strlen(NAMES[i]) == h->name_len && !memcmp(name, NAMES[i], h->name_len)) return 1;
    return 0;
}

/* Whether `request_id` keeps a caller's id `v` (its WELL_FORMED: 1..128 of
 * A-Za-z0-9._:-, and not the warm-ups' QUIET_ID) rather than making one. */
static int kept_id(const char *v, uint32_t n) {
    if (n == 0 || n > 128 || (n == 6 && !memcmp(v, "warmup", 6))) return 0;
    for (uint32_t i = 0; i < n; i++) {
        char c = v[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-'))
            return 0;
    }
    return 1;
}

/* A Host the front takes without `_target` or `_check_host` having anything to say:
 * a reg-name of letters, digits, '.', '-' and an optional ":" port of up to 5 digits. */
static int plain_host(const uint8_t *v, uint32_t n) {
    uint32_t i = 0;
    while (i < n && ((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'z') ||
                     (v[i] >= 'A' && v[i] <= 'Z') || v[i] == '.' || v[i] == '-'))
        i++;
    if (i == n) return 1;
    if (v[i] != ':' || n - i - 1 > 5) return 0;
    for (i++; i < n; i++) if (v[i] < '0' || v[i] > '9') return 0;
    return 1;
}

/* A path routing and the front take as is: origin-form, no fragment, nothing the
 * front's segment check (`_check_segments`) would look at. */
static int plain_path(const char *url, size_t n) {
    if (n == 0 || url[0] != '/') return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = url[i];
        if (ch == '?') break;
        if (ch == '#' || ch == '%' || ch == '\\' || (ch == '.' && url[i - 1] == '/')) return 0;
    }
    return memchr(url, '#', n) == NULL;
}

static uint64_t hash(const uint8_t *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) { h ^= s[i]; h *= 1099511628211ull; }
    return h;
}

/* The Chromium major version client hints `v` (n bytes) claim, 0 for none: the first
 * match of classify.py's `_HINT`, '"(?:Chromium|Google Chrome|Microsoft Edge)";\s*v="(\d{1,6})"' */
static long hinted(const char *v, size_t n) {
    static const char *const BRANDS[3] = {"Chromium", "Google Chrome", "Microsoft Edge"};
    for (size_t i = 0; i < n; i++) {
        if (v[i] != '"') continue;
        for (int b = 0; b < 3; b++) {
            size_t j = i + 1, len = strlen(BRANDS[b]);
            if (n - j < len + 2 || memcmp(v + j, BRANDS[b], len) || v[j + len] != '"' ||
                    v[j + len + 1] != ';')
                continue;
            j += len + 2;
            while (j < n && (v[j] == ' ' || v[j] == '\t' || v[j] == '\n' || v[j] == '\r' ||
                             v[j] == '\f' || v[j] == '\v'))
                j++;
            if (n - j < 3 || memcmp(v + j, "v=\"", 3)) continue;
            j += 3;
            size_t d = 0;
            long major = 0;
            while (d < 7 && j + d < n && v[j + d] >= '0' && v[j + d] <= '9')
                major = major * 10 + (v[j + d++] - '0');
            if (d >= 1 && d <= 6 && j + d < n && v[j + d] == '"') return major;
        }
    }
    return 0;
}

/* A browser's verdict by its other headers, as `Classifier.classify` decides it (on
 * `dict(headers)`: a name's last value): without Accept or Accept-Language, or a
 * Sec-Fetch-Mode its version sends, or with Sec-CH-UA hints that disagree with its
 * Chrome version, it is automation. */
static int browser_verdict(const req_t *q, const ua_slot *s) {
    int accept = 0, language = 0, fetch = 0;
    const hdr_t *hints = NULL;
    for (uint32_t i = 0; i < q->nh; i++) {
        const hdr_t *h = &q->h[i];
        if (name_is(q, h, "accept", 6)) accept = 1;
        else if (name_is(q, h, "accept-language", 15)) language = 1;
        else if (name_is(q, h, "sec-fetch-mode", 14)) fetch = 1;
        else if (name_is(q, h, "sec-ch-ua", 9)) hints = h;
    }
    if (!accept || !language) return s->of[BV_MISSING];
    if (s->sec_fetch && !fetch) return s->of[BV_NO_SEC_FETCH];
    if (hints && hinted(q->head + hints->value, hints->value_len) != s->chrome)
        return s->of[BV_HINTS];
    return s->of[BV_BROWSER];
}

/* What Python's `classify(ua)` answered, into `s`: an int (the verdict, -1 for Python),
 * or for a browser the tuple (the four BV_* verdicts, its Chrome version, whether it
 * sends Sec-Fetch-*). 0; 1 when it named a verdict past the C's table (Python's this
 * time, not kept); -1 with a Python error. */
static int read_verdict(const Lane *l, PyObject *r, ua_slot *s) {
    Py_ssize_t n = PyTuple_GET_SIZE(l->verdict_class);
    int past = 0;
    s->browser = PyTuple_Check(r);
    if (!s->browser) {
        long v = PyLong_AsLong(r);
        if (v == -1 && PyErr_Occurred()) return -1;
        past = v < -1 || v >= n;
        s->verdict = past ? -1 : (int)v;
        return past;
    }
    int of[N_BV], fetch;
    long chrome;
    if (!PyArg_ParseTuple(r, "iiiilp", &of[0], &of[1], &of[2], &of[3], &chrome, &fetch))
        return -1;
    s->verdict = 0;
    for (int i = 0; i < N_BV; i++) {
        if (of[i] < 0) s->verdict = -1;  /* Python's: its table was full */
        if (of[i] < -1 || of[i] >= n) past = 1;
        s->of[i] = of[i];
    }
    s->chrome = chrome;
    s->sec_fetch = fetch;
    if (s->verdict < 0 || past) {
        s->browser = 0;
        s->verdict = -1;
    }
    return past;
}

/* The verdict of a request's User-Agent (0: none sent), from the lane's table or
 * Python's `classify` (a browser's from its other headers too: `browser_verdict`);
 * -1: leave it to Python. -2: a Python error. */
static int verdict_of(Lane *l, const req_t *q) {
    const hdr_t *ua = NULL;
    for (uint32_t i = 0; i < q->nh; i++)
        if (name_is(q, &q->h[i], "user-agent", 10)) {
            if (ua) return -1;  /* two: dict() keeps the last; Python decides */
            ua = &q->h[i];
        }
    if (!ua || ua->value_len == 0) return 0;
    if (ua->value_len > UA_MAX) return -1;
    const uint8_t *v = (const uint8_t *)q->head + ua->value;
    size_t mask = UA_SLOTS - 1, i = (size_t)hash(v, ua->value_len) & mask;
    for (size_t probes = 0; probes < UA_SLOTS; probes++, i = (i + 1) & mask) {
        ua_slot *s = &l->uas[i];
        if (!s->ua) break;
        if ((size_t)PyBytes_GET_SIZE(s->ua) == ua->value_len &&
                !memcmp(PyBytes_AS_STRING(s->ua), v, ua->value_len))
            return s->browser ? browser_verdict(q, s) : s->verdict;
    }
    PyObject *key = PyBytes_FromStringAndSize((const char *)v, ua->value_len);
    if (!key) return -2;
    PyObject *r = PyObject_CallOneArg(l->classify, key);
    ua_slot got = {0};
    int read = r ? read_verdict(l, r, &got) : -1;
    Py_XDECREF(r);
    if (read < 0) {
        Py_DECREF(key);
        return -2;
    }
    if (!read && l->n_uas < UA_SLOTS / 2 && !l->uas[i].ua) {
        got.ua = key;
        l->uas[i] = got;
        l->n_uas++;
    } else {
        Py_DECREF(key);
    }
    return got.browser ? browser_verdict(q, &got) : got.verdict;
}

#include "lane_routes.c.h"

static uint8_t *put_str(uint8_t *o, const void *s, uint32_t n) {
    memcpy(o, &n, 4);
    memcpy(o + 4, s, n);
    return o + 4 + n;
}

static uint8_t *put_blob(uint8_t *o, PyObject *b) {
    size_t n = (size_t)PyBytes_GET_SIZE(b);
    memcpy(o, PyBytes_AS_STRING(b), n);
    return o + n;
}

/* The request in the function ABI into l->req, as `encode_request` writes it; its
 * length, or 0 (no memory). */
static size_t encode(Lane *l, const route_t *r, PyObject *principal, int method,
                     const char *path, size_t path_len, const char *query, size_t query_len) {
    const req_t *q = &l->q;
    size_t n = 4 + 4 * 6 + 4 + path_len + query_len + (size_t)q->nh * 8 + q->head_len +
               (size_t)PyBytes_GET_SIZE(r->env_blob) + (size_t)q->body_len + 4 /* params */ +
               (size_t)PyBytes_GET_SIZE(principal) + r->path_len + path_len +
               8 * ((size_t)q->ncaps + 1);
    if (grow(&l->req, &l->req_cap, n)) return 0;
    uint8_t *o = l->req;
    memcpy(o, "EFQ1", 4);
    o = put_str(o + 4, METHOD_NAMES[method], (uint32_t)strlen(METHOD_NAMES[method]));
    o = put_str(o, path, (uint32_t)path_len);
    o = put_str(o, query, (uint32_t)query_len);
    memcpy(o, &q->nh, 4);
    o += 4;
    for (uint32_t i = 0; i < q->nh; i++) {
        o = put_str(o, q->head + q->h[i].name, q->h[i].name_len);
        o = put_str(o, q->head + q->h[i].value, q->h[i].value_len);
    }
    o = put_blob(o, r->env_blob);
    o = put_str(o, q->body ? q->body : "", (uint32_t)q->body_len);
    /* params: encode_params(captures), a count then (name, value) pairs, latin-1: the
     * names after a pattern's ':'s, the values the path's bytes, then a final `*`'s
     * (the Router's order; NO_PAIRS: none) */
    uint32_t count = q->ncaps + (r->wildcard ? 1 : 0);
    memcpy(o, &count, 4);
    o += 4;
    for (uint32_t i = 0, k = 0; i < r->nseg && k < q->ncaps; i++) {
        if (!r->seg[i].capture) continue;
        o = put_str(o, r->path + r->seg[i].at + 1, r->seg[i].len - 1);
        o = put_str(o, path + q->caps[k].at, q->caps[k].len);
        k++;
    }
    if (r->wildcard) {
        o = put_str(o, "*", 1);
        o = put_str(o, path + q->rest_at, q->rest_len);
    }
    o = put_blob(o, principal);
    return (size_t)(o - l->req);
}

/* The guest's frame checked as abi.decode_response checks it; its pairs section or
 * NULL (then Python runs the request and says what is wrong). */
static const uint8_t *check_frame(const uint8_t *p, uint64_t len, uint32_t *status,
                                  uint32_t *count, const uint8_t **body, uint32_t *body_len) {
    if (!p || len < 8) return NULL;
    *status = get_u32(p);
    *count = get_u32(p + 4);
    if (*status < 200 || *status > 599 || *count > MAX_HEAD_FIELDS ||
            (uint64_t)*count * 8 > len - 8)
        return NULL;
    uint64_t pos = 8, head = 0;
    for (uint32_t i = 0; i < *count; i++) {
        if (len - pos < 4) return NULL;
        uint32_t n = get_u32(p + pos);
        if (n == 0 || n > len - pos - 4) return NULL;
        for (uint32_t j = 0; j < n; j++) if (!TCHAR[p[pos + 4 + j]]) return NULL;
        pos += 4 + (uint64_t)n;
        if (len - pos < 4) return NULL;
        uint32_t m = get_u32(p + pos);
        if (m > len - pos - 4) return NULL;
        for (uint32_t j = 0; j < m; j++) {
            uint8_t ch = p[pos + 4 + j];
            if ((ch < 0x20 && ch != '\t') || ch == 0x7f) return NULL;  /* abi.CTL */
        }
        pos += 4 + (uint64_t)m;
        head += (uint64_t)n + m;
        if (head > MAX_HEAD_BYTES) return NULL;
    }
    if (len - pos < 4) return NULL;
    *body_len = get_u32(p + pos);
    if (*body_len > len - pos - 4) return NULL;
    *body = p + pos + 4;
    return p + 8;
}

/* Whether the guest's response says something of freshness (`_first` stores it). */
static int may_store(const uint8_t *p, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) {
        uint32_t n = get_u32(p), m = get_u32(p + 4 + n);
        const uint8_t *name = p + 4;
        char lower[16];
        if (n == 13 || n == 7) {
            for (uint32_t j = 0; j < n; j++)
                lower[j] = (char)(name[j] >= 'A' && name[j] <= 'Z' ? name[j] + 32 : name[j]);
            if ((n == 13 && !memcmp(lower, "cache-control", 13)) ||
                    (n == 7 && !memcmp(lower, "expires", 7)))
                return 1;
        }
        p += 8 + (size_t)n + m;
    }
    return 0;
}

#define PUT(s, n) do { memcpy(o, (s), (n)); o += (n); } while (0)
#define PUTS(lit) PUT(lit, sizeof(lit) - 1)

static char *put_u64(char *o, uint64_t v) {
    char tmp[24];
    int i = 0;
    do { tmp[i++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (i) *o++ = tmp[--i];
    return o;
}

static char *put_hex(char *o, uint64_t v) {
    char tmp[24];
    int i = 0;
    do { tmp[i++] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    while (i) *o++ = tmp[--i];
    return o;
}

static int dropped(const Lane *l, const uint8_t *name, uint32_t n) {
    /* dispatch drops a guest's x-edgefn-* (and its Cache-Tag, the HTTP cache's whether
     * or not one runs: `cache.http.cache.client_view`), request_id its request id
     * header, the front the framing headers (HOP_BY_HOP) */
    static const char *HOP[8] = {"content-length", "transfer-encoding", "connection",
                                 "keep-alive", "upgrade", "te", "trailer", "proxy-connection"};
    char lower[64];
    if (n >= 9) {  /* any length: a longer reserved name was forged past it */
        for (uint32_t j = 0; j < 9; j++)
            lower[j] = (char)(name[j] >= 'A' && name[j] <= 'Z' ? name[j] + 32 : name[j]);
        if (!memcmp(lower, "x-edgefn-", 9)) return 1;
    }
    if (n >= sizeof lower) return 0;
    for (uint32_t j = 0; j < n; j++)
        lower[j] = (char)(name[j] >= 'A' && name[j] <= 'Z' ? name[j] + 32 : name[j]);
    if (n == l->rid_header_len && !memcmp(lower, l->rid_header, n)) return 1;
    if (n == 9 && !memcmp(lower, "cache-tag", 9)) return 1;
    for (int i = 0; i < 8; i++)
        if (strlen(HOP[i]) == n && !memcmp(HOP[i], lower, n)) return 1;
    return 0;
}

/* What a request's answer says of its connection (the call's 17th field holds it):
 * CONN_HTTP10, an HTTP/1.0 request; CONN_CLOSE, not kept alive. */
enum { CONN_HTTP10 = 1, CONN_CLOSE = 2 };

static int conn_of(const req_t *q) {
    return (q->http10 ? CONN_HTTP10 : 0) | (q->close ? CONN_CLOSE : 0);
}

/* `status`'s line (`line`: STATUS_LINES', None for one it does not name) at `o`; past it. */
static char *put_status(char *o, PyObject *line, uint32_t status) {
    if (line == Py_None) {
        PUTS("HTTP/1.1 ");
        o = put_u64(o, status);
        PUTS(" Unknown\r\n");
    } else {
        PUT(PyBytes_AS_STRING(line), (size_t)PyBytes_GET_SIZE(line));
    }
    return o;
}

/* The request id's header line, and the connection's (`conn`: CONN_*), at `o`; past them. */
static char *put_id_and_connection(const Lane *l, char *o, const char *rid, size_t rid_len,
                                   int conn) {
    PUT(l->rid_header, l->rid_header_len);
    PUTS(": ");
    PUT(rid, rid_len);
    PUTS("\r\n");
    if (conn & CONN_CLOSE) PUTS("connection: close\r\n");
    else if (conn & CONN_HTTP10) PUTS("connection: keep-alive\r\n");  /* a 1.0 client
                                                        * assumes a close unless told */
    return o;
}

/* The response as the front writes it (protocol.py `_head`, `_write`) into l->out;
 * `conn` (CONN_*): `connection: close` for one not kept alive, `connection:
 * keep-alive` for HTTP/1.0 kept alive. -1: no memory. */
static int write_response(Lane *l, const route_t *r, uint32_t status, const uint8_t *pairs,
                          uint32_t count, const uint8_t *body, uint32_t body_len,
                          const char *rid, size_t rid_len, PyObject *date, PyObject *extra,
                          int method, int conn) {
    PyObject *line = PyTuple_GET_ITEM(l->status_lines, status);  /* 200..599 */
    size_t need = 64 + (line == Py_None ? 32 : (size_t)PyBytes_GET_SIZE(line)) +
                  (size_t)PyBytes_GET_SIZE(date) + (size_t)PyBytes_GET_SIZE(extra) +
                  (size_t)PyBytes_GET_SIZE(r->label) + l->rid_header_len + rid_len +
                  (size_t)body_len + 96 +
                  (l->limit_head ? (size_t)PyBytes_GET_SIZE(l->limit_head) : 0);
    const uint8_t *p = pairs;
    int dated = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t n = get_u32(p), m = get_u32(p + 4 + n);
        if (n == 4 && !dropped(l, p + 4, n)) {
            const uint8_t *s = p + 4;
            if ((s[0] | 32) == 'd' && (s[1] | 32) == 'a' && (s[2] | 32) == 't' &&
                    (s[3] | 32) == 'e')
                dated = 1;
        }
        need += (size_t)n + m + 4;
        p += 8 + (size_t)n + m;
    }
    if (grow(&l->out, &l->out_cap, l->out_len + need)) return -1;
    char *o = (char *)l->out + l->out_len;
    o = put_status(o, line, status);
    if (!dated) PUT(PyBytes_AS_STRING(date), (size_t)PyBytes_GET_SIZE(date));
    PUT(PyBytes_AS_STRING(extra), (size_t)PyBytes_GET_SIZE(extra));
    p = pairs;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t n = get_u32(p), m = get_u32(p + 4 + n);
        const uint8_t *name = p + 4, *value = p + 8 + n;
        p += 8 + (size_t)n + m;
        if (dropped(l, name, n)) continue;
        for (uint32_t j = 0; j < n; j++)
            *o++ = (char)(name[j] >= 'A' && name[j] <= 'Z' ? name[j] + 32 : name[j]);
        PUTS(": ");
        PUT(value, m);
        PUTS("\r\n");
    }
    PUTS("x-edgefn-function: ");
    PUT(PyBytes_AS_STRING(r->label), (size_t)PyBytes_GET_SIZE(r->label));
    PUTS("\r\n");
    if (r->cache == CACHE_FIRST) {  /* http_cache's `answered` (MISS), `_bypassed` (unsafe) */
        if (method >= MC_POST) PUTS("x-edgefn-cache: BYPASS\r\n");
        else PUTS("x-edgefn-cache: MISS\r\n");
    }
    if (l->limit_head)  /* ratelimit's fields, added after http_cache's (`_add`) */
        PUT(PyBytes_AS_STRING(l->limit_head), (size_t)PyBytes_GET_SIZE(l->limit_head));
    o = put_id_and_connection(l, o, rid, rid_len, conn);
    int no_body = status == 204 || status == 304;
    if (!no_body) {
        PUTS("content-length: ");
        o = put_u64(o, status == 205 ? 0 : body_len);
        PUTS("\r\n");
    }
    PUTS("\r\n");
    if (!no_body && status != 205 && method != MC_HEAD) PUT(body, body_len);
    l->out_len = (size_t)((uint8_t *)o - l->out);
    return 0;
}

/* A refusal as the front writes the stages' error response (protocol.py `_head`,
 * `_write`) into l->out: its status line, the date, `head` (its header lines as
 * ratelimit's `lane_refusal` made them, each ending in CRLF), the request id, the
 * connection, the length, `body` (not for HEAD). A refusal's status is 400..599, never
 * one without a body. -1: no memory. */
static int write_refusal(Lane *l, uint32_t status, PyObject *head, PyObject *body,
                         const char *rid, size_t rid_len, PyObject *date, PyObject *extra,
                         int method, int conn) {
    PyObject *line = PyTuple_GET_ITEM(l->status_lines, status);
    size_t body_len = (size_t)PyBytes_GET_SIZE(body);
    size_t need = 128 + (line == Py_None ? 32 : (size_t)PyBytes_GET_SIZE(line)) +
                  (size_t)PyBytes_GET_SIZE(date) + (size_t)PyBytes_GET_SIZE(extra) +
                  (size_t)PyBytes_GET_SIZE(head) + l->rid_header_len + rid_len + body_len;
    if (grow(&l->out, &l->out_cap, l->out_len + need)) return -1;
    char *o = (char *)l->out + l->out_len;
    o = put_status(o, line, status);
    PUT(PyBytes_AS_STRING(date), (size_t)PyBytes_GET_SIZE(date));
    PUT(PyBytes_AS_STRING(extra), (size_t)PyBytes_GET_SIZE(extra));
    PUT(PyBytes_AS_STRING(head), (size_t)PyBytes_GET_SIZE(head));
    o = put_id_and_connection(l, o, rid, rid_len, conn);
    PUTS("content-length: ");
    o = put_u64(o, body_len);
    PUTS("\r\n\r\n");
    if (method != MC_HEAD) PUT(PyBytes_AS_STRING(body), body_len);
    l->out_len = (size_t)((uint8_t *)o - l->out);
    return 0;
}

static double now_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- the record of a request the lane answered ---------------------------------------- */
/* A request's id as its record and its call carry it: the caller's that `request_id`
 * keeps (`kept`, bytes), else the number it gives (an int). A new reference, or NULL
 * with a Python error. */
static PyObject *id_object(uint64_t number, const char *kept, size_t kept_len) {
    return kept ? PyBytes_FromStringAndSize(kept, (Py_ssize_t)kept_len)
                : PyLong_FromUnsignedLongLong(number);
}

/* A request's path as its record and its call carry it: None when it is its route's
 * own (`path` NULL), else the path (bytes). A new reference, NULL with a Python error. */
static PyObject *path_object(const char *path, size_t n) {
    return path ? PyBytes_FromStringAndSize(path, (Py_ssize_t)n) : Py_NewRef(Py_None);
}

#include "lane_records.c.h"

/* Request id number `counter` as `request_id` writes it (prefix-hex) into `rid`
 * (96 bytes); its length. */
static size_t request_id(const Lane *l, uint64_t counter, char *rid) {
    memcpy(rid, l->prefix, l->prefix_len);
    rid[l->prefix_len] = '-';
    return (size_t)(put_hex(rid + l->prefix_len + 1, counter) - rid);
}

/* The verdict of the request in l->q (`verdict_of`, found once a request): its index,
 * -1 for Python (a Python error is Python's too: cleared). */
static int request_verdict(Lane *l) {
    req_t *q = &l->q;
    if (!q->judged) {
        q->verdict = verdict_of(l, q);
        if (q->verdict == -2) {
            PyErr_Clear();
            q->verdict = -1;
        }
        q->judged = 1;
    }
    return q->verdict;
}

/* The verdict of the request in l->q, if the lane may serve it for `r`: a verdict
 * index, -1 for Python. */
static int allowed_verdict(Lane *l, const route_t *r, long *cls) {
    int verdict = request_verdict(l);
    if (verdict < 0 || verdict >= PyTuple_GET_SIZE(l->verdict_class)) return -1;
    *cls = PyLong_AsLong(PyTuple_GET_ITEM(l->verdict_class, verdict));
    if (*cls < 0 || *cls >= 32 || !(r->allowed & (1u << *cls))) return -1;
    return verdict;
}

/* The request being served counted by ratelimit (`limit_count` called with what
 * `limit_admits` said of it, its arguments, let go): the header lines it adds (bytes,
 * a new reference); NULL with a Python error (TypeError: not a tuple, not bytes). */
static PyObject *limit_count(Lane *l) {
    PyObject *token = l->limit_token, *head = NULL;
    if (PyTuple_Check(token))
        head = PyObject_Call(l->limit_count, token, NULL);
    else
        PyErr_SetString(PyExc_TypeError,
                        "limiter's admits: the arguments of its count (a tuple)");
    Py_CLEAR(l->limit_token);
    if (head && !PyBytes_Check(head)) {
        Py_DECREF(head);
        PyErr_SetString(PyExc_TypeError, "limiter's count: header lines (bytes)");
        return NULL;
    }
    return head;
}

/* The request in l->q, for Python route `r`: its call (the frame, the client, ...)
 * handed to Python's `submit` (the function's pool runs it, or the command runs; its
 * answer comes back to `respond`, or to Python's own finish). 2: started (the call, a tuple, in l->started: serve stops after it, as
 * the connection has a response in progress), 0 for Python (submit said no: a
 * concurrency limit), -1 a Python error (nothing submitted). */
static int python_call(Lane *l, route_t *r, int ri, int method, const hdr_t *host,
                       const char *url, size_t path_len, const char *query, size_t query_len,
                       PyObject *client) {
    const req_t *q = &l->q;
    for (uint32_t i = 0; i < q->nh; i++)
        if (name_is(q, &q->h[i], "cdn-loop", 8)) return 0;  /* the call's Lineage reads it */
    long cls;
    int verdict = allowed_verdict(l, r, &cls);
    if (verdict < 0) return 0;
    uint64_t started = mono_ns();
    double ts = now_wall();
    size_t n = encode(l, r, PyTuple_GET_ITEM(l->class_blobs, cls), method, url, path_len,
                      query, query_len);
    if (!n) { PyErr_NoMemory(); return -1; }
    /* the isolate's REQUEST frame (wire.frame(REQUEST, the request encoded)): its
     * length (u32 LE, the kind and what follows), the kind, the request */
    PyObject *frame = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n + 5);
    if (!frame) return -1;
    uint8_t *fp = (uint8_t *)PyBytes_AS_STRING(frame);
    uint32_t framed = (uint32_t)n + 1;
    memcpy(fp, &framed, 4);  /* (x86-64, aarch64: little-endian) */
    fp[4] = 'Q';
    memcpy(fp + 5, l->req, n);
    /* (future, route, table generation, route index, id (`id_object`), verdict, method,
     * host, query, client, ts, started ns, frame, request body bytes, path (`path_object`),
     * ratelimit's fields (header lines; None where it counts nothing), its connection
     * (`conn_of`)): the future and the fields are set once submitted */
    PyObject *id = id_object(l->counter + 1, q->rid, q->rid_len);
    PyObject *path = id ? path_object(q->sub ? url : NULL, path_len) : NULL;
    if (!path) { Py_XDECREF(id); Py_DECREF(frame); return -1; }
    PyObject *call = Py_BuildValue("(OOKiNiiy#y#OdKNKNOi)", Py_None, r->python,
                                   (unsigned long long)l->generation, ri, id, verdict, method,
                                   q->head + host->value, (Py_ssize_t)host->value_len, query,
                                   (Py_ssize_t)query_len, client, ts,
                                   (unsigned long long)started, frame,
                                   (unsigned long long)l->q.body_len, path, Py_None,
                                   conn_of(q));
    if (!call) return -1;
    PyObject *future = PyObject_CallFunction(l->submit, "iO", ri, call);
    if (!future || future == Py_None) {
        Py_DECREF(call);
        Py_XDECREF(future);
        return future ? 0 : -1;
    }
    if (!q->rid) l->counter++;  /* the number `request_id` would have given it */
    PyTuple_SET_ITEM(call, 0, future);  /* a fresh tuple: its None is replaced */
    Py_DECREF(Py_None);
    Py_XSETREF(l->started, call);  /* (serve gives back its slot if what follows fails) */
    if (l->limit_token) {  /* submitted: counted now, as ratelimit counts it before dispatch */
        PyObject *head = limit_count(l);
        if (!head) return -1;
        PyTuple_SET_ITEM(call, 15, head);
        Py_DECREF(Py_None);
    }
    return 2;
}

/* Whether `r`'s function may run inline now: 1; 0 when it has a request in flight (a
 * rerun on a thread, or a limit to apply) or runs on the worker threads for good; -1
 * a Python error. */
static int runs_inline(Lane *l, const route_t *r) {
    PyObject *inflight = PyObject_GetAttr(r->fn, l->inflight_name);
    if (!inflight) return -1;
    int busy = PyObject_IsTrue(inflight);
    Py_DECREF(inflight);
    if (busy) return busy < 0 ? -1 : 0;
    PyObject *threaded = PyObject_GetAttr(r->executor, l->threaded_name);
    if (!threaded) return -1;
    busy = PyObject_IsTrue(threaded);
    Py_DECREF(threaded);
    return busy < 0 ? -1 : !busy;
}

/* Whether the request in l->q may run inline now for `r` (a reactor's call, a command's
 * run): 1 with its verdict and bot class, and the clocks its record reads, set; 0 for
 * Python (its function busy or on the threads, a verdict the lane may not serve); -1 a
 * Python error. */
typedef struct { int verdict; long cls; uint64_t started; double ts; } start_t;

static int inline_start(Lane *l, const route_t *r, start_t *s) {
    int idle = runs_inline(l, r);
    if (idle <= 0) return idle;
    s->verdict = allowed_verdict(l, r, &s->cls);
    if (s->verdict < 0) return 0;
    s->started = mono_ns();
    s->ts = now_wall();
    return 1;
}

/* The response frame `frame` (a guest's, or a command's answer made one: `cgi_frame`)
 * written as the front writes it, its record appended: 1; 0 when it is Python's (not
 * as abi.decode_response takes it, or one http_cache stores: Python runs the request
 * again, a pure function); -1 a Python error. */
static int answer_frame(Lane *l, const route_t *r, int ri, int method, const uint8_t *frame,
                        uint64_t frame_len, uint64_t started, double ts, int verdict,
                        const hdr_t *host, const char *query, size_t query_len, PyObject *date,
                        PyObject *extra, PyObject *events, PyObject *client) {
    uint32_t status, count, body_len = 0;
    const uint8_t *body = NULL;
    const uint8_t *pairs = check_frame(frame, frame_len, &status, &count, &body, &body_len);
    if (!pairs) return 0;
    if (r->cache == CACHE_FIRST && method == MC_GET && may_store(pairs, count))
        return 0;  /* http_cache stores it: Python runs it again (a pure function) */
    if (l->limit_token) {  /* answered: counted now, as ratelimit counts what it admits */
        l->limit_head = limit_count(l);
        if (!l->limit_head) return -1;
    }
    const char *kept = l->q.rid;  /* the caller's id, else a number of the counter's */
    uint64_t counter = kept ? 0 : ++l->counter;
    char made[96];
    size_t rid_len = kept ? l->q.rid_len : request_id(l, counter, made);
    size_t before = l->out_len;
    int unwritten = write_response(l, r, status, pairs, count, body, body_len,
                                   kept ? kept : made, rid_len, date, extra, method,
                                   conn_of(&l->q));
    Py_CLEAR(l->limit_head);
    if (unwritten) {
        l->counter -= !kept;
        PyErr_NoMemory();
        return -1;
    }
    uint64_t took = mono_ns() - started;
    /* a HEAD's body is not sent (its length is): no bytes out, as Python's events say */
    if (add_record(events, ts, counter, kept, rid_len, ri, status,
                   method == MC_HEAD ? 0 : body_len, took, verdict,
                   method, l->q.head + host->value, host->value_len, query, query_len, client,
                   l->q.body_len, l->q.sub ? l->q.url : NULL, l->q.path_len, NULL)) {
        /* not answered after all: Python answers it, with this number unused */
        l->out_len = before;
        l->counter -= !kept;
        return -1;
    }
    return 1;
}

#include "lane_cgi.c.h"

/* The route that may serve the request in l->q by what its head says (its index, its
 * Host in `*host_out`), -1 when it is Python's, -2 a Python error. What the head
 * decides: sizes, path, headers, Host, the route, an Origin, what http_cache reads. */
static int admit(Lane *l, int method, const hdr_t **host_out) {
    req_t *q = &l->q;
    if (q->url_len > l->max_url || q->py_head > l->max_head) return -1;
    if (!plain_path(q->url, q->url_len)) return -1;
    const hdr_t *host = NULL;
    int framed = 0;  /* an unsafe method's one Content-Length (its body whole: on_body) */
    int rid_seen = 0;  /* request_id reads the first id header (Request.header) */
    q->rid = NULL;
    for (uint32_t i = 0; i < q->nh; i++) {
        const hdr_t *h = &q->h[i];
        if (name_is(q, h, "host", 4)) {
            if (host) return -1;
            host = h;
        } else if (method >= MC_POST && !framed && name_is(q, h, "content-length", 14)) {
            framed = 1;
        } else if (h->name_len == l->rid_header_len &&
                   !memcmp(q->head + h->name, l->rid_header, h->name_len)) {
            if (!rid_seen++ && l->trust && kept_id(q->head + h->value, h->value_len)) {
                q->rid = q->head + h->value;
                q->rid_len = h->value_len;
            }
        } else if (name_is(q, h, "connection", 10) &&
                   ((h->value_len == 10 && !strncasecmp(q->head + h->value, "keep-alive", 10))
                    || (h->value_len == 5 && !strncasecmp(q->head + h->value, "close", 5)))) {
            /* keep-alive: what HTTP/1.1 means anyway; close: the last request (both
             * llhttp's keep-alive, which serve reads, as the front does): the front
             * reads nothing else of it, the function gets it as sent. Python's
             * requests, httpx (the openai client) and Node's agents send keep-alive */
        } else if (handed_over(l, q, h)) {
            return -1;
        }
    }
    if (!host || !plain_host((const uint8_t *)q->head + host->value, host->value_len))
        return -1;
    const char *mark = memchr(q->url, '?', q->url_len);
    size_t path_len = mark ? (size_t)(mark - q->url) : q->url_len;
    int ri = find_route(l, q->url, path_len, q);
    if (ri < 0) return -1;
    route_t *r = &l->routes[ri];
    q->sub = r->pattern || r->path_len != path_len;
    q->path_len = (uint32_t)path_len;
    if (r->origin)  /* what `cors` answers, or tags: Python's */
        for (uint32_t i = 0; i < q->nh; i++)
            if (name_is(q, &q->h[i], "origin", 6)) return -1;
    if (r->cache == CACHE_FIRST) {
        /* what would make http_cache look up, validate or bypass: Python's */
        for (uint32_t i = 0; i < q->nh; i++) {
            const hdr_t *h = &q->h[i];
            if (name_is(q, h, "range", 5) || name_is(q, h, "cache-control", 13) ||
                    name_is(q, h, "if-none-match", 13) || name_is(q, h, "if-modified-since", 17))
                return -1;
        }
        int stored = PySet_Contains(r->caching, r->label_str);
        if (stored) return stored < 0 ? -2 : -1;
    }
    *host_out = host;
    return ri;
}

/* The request in l->q for route `ri` (`admit`'s), run: 1 served, 0 for Python, -1 a
 * Python error. */
static int serve_route(Lane *l, int ri, int method, const hdr_t *host, PyObject *date,
                       PyObject *extra, PyObject *events, PyObject *client) {
    req_t *q = &l->q;
    route_t *r = &l->routes[ri];
    const char *url = q->url, *query = url + q->path_len + 1;
    size_t path_len = q->path_len, query_len = 0;
    if (path_len < q->url_len) query_len = q->url_len - path_len - 1;
    else query = "";
    if (r->cgi && l->wasi_run) {
        int done = command_call(l, r, ri, method, host, url, path_len, query, query_len, date,
                                extra, events, client);
        if (l->cgi_cap > ((size_t)1 << 20)) {  /* a large answer's buffer is not kept */
            free(l->cgi);
            l->cgi = NULL;
            l->cgi_cap = 0;
        }
        if (done) return done;
    }
    if (r->python) return python_call(l, r, ri, method, host, url, path_len, query, query_len,
                                      client);
    start_t s;
    int go = inline_start(l, r, &s);
    if (go <= 0) return go;
    size_t n = encode(l, r, PyTuple_GET_ITEM(l->class_blobs, s.cls), method, url, path_len,
                      query, query_len);
    if (!n) { PyErr_NoMemory(); return -1; }
    int32_t failed;
    edgefn_result *res = &l->result;
    memset(res, 0, sizeof *res);
    Py_BEGIN_ALLOW_THREADS
    failed = l->call(r->engine, r->pre, r->memory_limit, r->deadline_ticks, l->req, n,
                     r->max_response, 1, res, r->times);
    Py_END_ALLOW_THREADS
    if (failed) {  /* a trap, a limit, the slice: Python runs it and contains it */
        if (res->trap) l->trap_delete(res->trap);
        if (res->error) l->error_delete(res->error);
        res->trap = res->error = NULL;
        /* this was its first inline run: Python's is its last (README "No function
         * stalls the PoP": inline at most twice, then the worker threads) */
        return PyObject_SetAttr(r->executor, l->lane_cut_name, Py_True) < 0 ? -1 : 0;
    }
    return answer_frame(l, r, ri, method, res->response, res->response_len, s.started, s.ts,
                        s.verdict, host, query, query_len, date, extra, events, client);
}

/* `question(ri, client)`: a stage's answer about a request for route `ri` from `client`
 * (ratelimit's `limit_admits`, `guard_ask`), a new reference; NULL with a Python error. */
static PyObject *ask(PyObject *question, int ri, PyObject *client) {
    PyObject *a[2] = {PyLong_FromLong(ri), client};
    if (!a[0]) return NULL;
    PyObject *answer = PyObject_Vectorcall(question, a, 2, NULL);
    Py_DECREF(a[0]);
    return answer;
}

/* The request in l->q for route `ri`, which a stage refused with `token`: (status,
 * header lines, body, (decisions, error)), the stages' error response: ratelimit's
 * (`limit_admits` said so, counted: `lane_refusal`'s) or bots' (`block`). Answered
 * with that response and recorded (its event: the verdict's decisions updated with
 * the refusal's `decisions`, and `error`), as the stages answer it: the function never
 * runs. `s`: its verdict, and the clocks its record reads. 1 served; -1 a Python error
 * (a token of the wrong shape, no memory: then the request is Python's, whose
 * ratelimit counts it again). */
static int refuse(Lane *l, int ri, int method, const hdr_t *host, const start_t *s,
                  PyObject *token, PyObject *date, PyObject *extra, PyObject *events,
                  PyObject *client) {
    req_t *q = &l->q;
    PyObject *head = PyTuple_GET_ITEM(token, 1), *body = PyTuple_GET_ITEM(token, 2);
    PyObject *refused = PyTuple_GET_ITEM(token, 3);
    long status = PyLong_AsLong(PyTuple_GET_ITEM(token, 0));
    if (status < 400 || status > 599 || !PyBytes_Check(head) || !PyBytes_Check(body) ||
            PyBytes_GET_SIZE(body) > UINT32_MAX || !PyTuple_Check(refused) ||
            PyTuple_GET_SIZE(refused) != 2 || !PyDict_Check(PyTuple_GET_ITEM(refused, 0)) ||
            !PyUnicode_Check(PyTuple_GET_ITEM(refused, 1))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "limiter's refusal: (status 400..599, header "
                            "lines, body, (decision dict, error str))");
        return -1;
    }
    const char *query = q->url + q->path_len + 1;
    size_t query_len = q->path_len < q->url_len ? q->url_len - q->path_len - 1 : 0;
    if (!query_len) query = "";
    const char *kept = q->rid;  /* the caller's id, else a number of the counter's */
    uint64_t counter = kept ? 0 : ++l->counter;
    char made[96];
    size_t rid_len = kept ? q->rid_len : request_id(l, counter, made);
    size_t before = l->out_len;
    if (write_refusal(l, (uint32_t)status, head, body, kept ? kept : made, rid_len, date,
                      extra, method, conn_of(q))) {
        l->counter -= !kept;
        PyErr_NoMemory();
        return -1;
    }
    if (add_record(events, s->ts, counter, kept, rid_len, ri, (uint32_t)status,
                   method == MC_HEAD ? 0 : (uint32_t)PyBytes_GET_SIZE(body),
                   mono_ns() - s->started, s->verdict,
                   method, q->head + host->value, host->value_len, query, query_len, client,
                   q->body_len, q->sub ? q->url : NULL, q->path_len, refused)) {
        l->out_len = before;
        l->counter -= !kept;
        return -1;
    }
    return 1;
}

/* The request in l->q for route `ri`, if its verdict's class is one `ri` blocks: bots'
 * 403 (`blocks`: as the stage refuses it, and records it), written and recorded by
 * `refuse`: 1. 0 when it is not blocked here, or its block is Python's (no verdict,
 * none rendered); -1 a Python error. Nothing after bots runs for it: ratelimit counts
 * nothing (the lane blocks only where no ratelimit comes before bots). */
static int block(Lane *l, int ri, int method, const hdr_t *host, PyObject *date,
                 PyObject *extra, PyObject *events, PyObject *client) {
    uint64_t started = mono_ns();
    int verdict = request_verdict(l);
    if (verdict < 0 || !l->blocks || verdict >= PyTuple_GET_SIZE(l->blocks) ||
            verdict >= PyTuple_GET_SIZE(l->verdict_class))
        return 0;
    long cls = PyLong_AsLong(PyTuple_GET_ITEM(l->verdict_class, verdict));
    PyObject *token = PyTuple_GET_ITEM(l->blocks, verdict);
    if (cls < 0 || cls >= 32 || !(l->routes[ri].blocked & (1u << cls)) || token == Py_None)
        return 0;
    start_t s = {verdict, cls, started, now_wall()};
    return refuse(l, ri, method, host, &s, token, date, extra, events, client);
}

/* The request in l->q for route `ri`, which guards its function (auth asks for a
 * credential): one that carries none (no Authorization, no x-api-key) is refused with
 * the route's `guard` (auth's 401; where ratelimit counts that refusal, what
 * `guard_ask` answers once it counted it: the 401, or its 429) when its verdict's class
 * is one the route allows (bots, before auth, lets it on), and recorded (`refuse`): 1;
 * anything else is
 * Python's (a credential: auth proves it, or not), 0; -1 a Python error. The function
 * never runs here: the route is in the table only for this. */
static int guarded(Lane *l, int ri, int method, const hdr_t *host, PyObject *date,
                   PyObject *extra, PyObject *events, PyObject *client) {
    const req_t *q = &l->q;
    for (uint32_t i = 0; i < q->nh; i++)
        if (name_is(q, &q->h[i], "authorization", 13) || name_is(q, &q->h[i], "x-api-key", 9))
            return 0;
    route_t *r = &l->routes[ri];
    start_t s = {0, 0, mono_ns(), 0.0};
    s.verdict = allowed_verdict(l, r, &s.cls);
    if (s.verdict < 0) return 0;
    s.ts = now_wall();
    if (!r->guard_counts)
        return refuse(l, ri, method, host, &s, r->guard, date, extra, events, client);
    if (!l->guard_ask) return 0;
    PyObject *token = ask(l->guard_ask, ri, client);  /* counted */
    if (!token) return -1;
    int done = PyTuple_Check(token) && PyTuple_GET_SIZE(token) == 4
                   ? refuse(l, ri, method, host, &s, token, date, extra, events, client)
                   : (PyErr_SetString(PyExc_TypeError, "guard_ask: a refusal (a 4-tuple)"), -1);
    Py_DECREF(token);
    return done;
}

/* The request in l->q, complete: 1 served (its response in l->out, its record in
 * `events`), 0 for Python, -1 a Python error. A limited route's request is asked of
 * ratelimit first (`limit_admits`: would it be admitted now? nothing counted), and
 * counted as it is answered (`answer_frame`), or as its call is submitted
 * (`python_call`: then its answer carries the fields, `read_call`): one the lane
 * leaves after all is Python's, whose stage counts it once. One ratelimit refuses is
 * Python's too, but on a route the lane `refuses` on: there its verdict is found
 * first (a class the lane may not serve is Python's, asked nothing), and ratelimit
 * counts it as it refuses it (`limit_admits` answers with the refusal: `refuse`). */
static int serve_one(Lane *l, int method, PyObject *date, PyObject *extra, PyObject *events,
                     PyObject *client) {
    const hdr_t *host = NULL;
    int ri = admit(l, method, &host);
    if (ri < 0) return ri == -2 ? -1 : 0;
    if (l->routes[ri].blocked) {
        int blocked = block(l, ri, method, host, date, extra, events, client);
        if (blocked) return blocked;
    }
    if (l->routes[ri].guard)  /* (never served past here: its function is Python's) */
        return guarded(l, ri, method, host, date, extra, events, client);
    if (l->routes[ri].limited) {
        if (!l->limit_admits) return 0;
        start_t s = {0, 0, 0, 0.0};
        if (l->routes[ri].refuses) {
            s.verdict = allowed_verdict(l, &l->routes[ri], &s.cls);
            if (s.verdict < 0) return 0;
            s.started = mono_ns();
            s.ts = now_wall();
        }
        PyObject *token = ask(l->limit_admits, ri, client);
        if (!token) return -1;
        if (token == Py_None) { Py_DECREF(token); return 0; }
        if (PyTuple_Check(token) && PyTuple_GET_SIZE(token) == 4) {  /* refused */
            int done = l->routes[ri].refuses
                           ? refuse(l, ri, method, host, &s, token, date, extra, events, client)
                           : (PyErr_SetString(PyExc_TypeError, "limiter's refusal for a "
                                              "route the lane does not refuse on"), -1);
            Py_DECREF(token);
            return done;
        }
        l->limit_token = token;
    }
    int done = serve_route(l, ri, method, host, date, extra, events, client);
    Py_CLEAR(l->limit_token);
    return done;
}

/* The body bytes the request `p` stopped in still needs, when the lane would wait for
 * them (`waiting`: the front holds what came until they are read, then serves it all
 * again): its head whole and one `admit` takes, an unsafe method's body framed by
 * Content-Length, all of it under max_body. 0: Python's, from this read
 * on, as before. (A client that writes the head and the body apart, httpx's, or a
 * body in a later TCP segment, reaches here.) */
static uint64_t held(Lane *l, llhttp_t *p) {
    req_t *q = &l->q;
    int method = method_code(p->method);
    if (!q->headed || q->bad || method < MC_POST || !p->content_length ||
            (p->flags & (F_CHUNKED | F_TRANSFER_ENCODING)) || !(p->flags & F_CONTENT_LENGTH) ||
            p->content_length > q->max_body - q->body_len)
        return 0;
    const hdr_t *host;
    int ri = admit(l, method, &host);
    if (ri == -2) PyErr_Clear();  /* the cache's set: the whole request asks again */
    return ri < 0 ? 0 : p->content_length;
}

/* serve(data, date, extra_head, budget, events, client) -> (used, out, call): the
 * whole requests at the start of `data` the lane answers, their responses (`out`) and
 * records (appended to `events`, a `Records`, each with `client`); `used` bytes of `data`
 * are answered, the rest is Python's. Stops once `out` reaches `budget` bytes, after a
 * request for a Python route, whose `call` (else None) is in progress: its answer goes
 * to `respond`, and after a request not kept alive (`closing`: what follows it is
 * never read). */
static PyObject *Lane_serve(Lane *l, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(a[0]) || !PyBytes_Check(a[1]) || !PyBytes_Check(a[2]) ||
            !is_records(a[4])) {
        PyErr_SetString(PyExc_TypeError,
                        "serve(data, date, extra_head, budget, events, client)");
        return NULL;
    }
    if (l->n_routes == 0 || !l->call)  /* nothing to serve: (used, out, call) all empty */
        return Py_BuildValue("(iyO)", 0, "", Py_None);
    Py_ssize_t budget = PyLong_AsSsize_t(a[3]);
    if (budget == -1 && PyErr_Occurred()) return NULL;
    const char *buf = PyBytes_AS_STRING(a[0]);
    size_t len = (size_t)PyBytes_GET_SIZE(a[0]), used = 0;
    llhttp_t p;
    ll_init(&p, HTTP_REQUEST, &SETTINGS);
    p.data = &l->q;
    l->out_len = 0;
    l->waiting = 0;
    l->closing = 0;
    int failed = 0;
    while (used < len && (Py_ssize_t)l->out_len < budget) {
        l->q.done = l->q.headed = 0;
        int err = ll_execute(&p, buf + used, len - used);
        if (err == HPE_OK && !l->q.done) {  /* `data` ends inside this request */
            l->waiting = held(l, &p);
            break;
        }
        if (err != HPE_PAUSED || !l->q.done || l->q.bad) break;
        const char *end = ll_error_pos(&p);
        if (!end || end < buf + used || end > buf + len) break;
        l->q.close = !ll_should_keep_alive(&p);
        int served = serve_one(l, method_code(p.method), a[1], a[2], a[4], a[5]);
        if (served < 0) { failed = 1; break; }
        if (!served) break;
        used = (size_t)(end - buf);
        if (l->q.close) {  /* the connection's last: nothing after it is read */
            l->closing = 1;
            break;
        }
        if (served == 2) break;  /* a Python call: what follows waits for its answer */
        ll_resume(&p);
    }
    if (failed && used == 0) return NULL;
    if (failed) PyErr_WriteUnraisable((PyObject *)l);  /* the rest is Python's */
    PyObject *call = l->started ? l->started : Py_NewRef(Py_None);
    l->started = NULL;
    return Py_BuildValue("(ny#N)", (Py_ssize_t)used, l->out ? (const char *)l->out : "",
                         (Py_ssize_t)l->out_len, call);  /* y# of NULL would be None */
}

/* A Python route's `call` (serve's), read back (`read_call`). */
typedef struct {
    route_t *r;
    long ri, verdict, method, conn;  /* conn: `conn_of` its request */
    unsigned long long counter, bytes_in, started;
    const char *rid;  /* the caller's id (the call's bytes), or NULL: `counter`'s */
    size_t rid_len;
    double ts;
    PyObject *host, *query, *client, *path;  /* path: bytes, or None (the route's) */
    PyObject *limit;  /* ratelimit's fields (bytes), or None */
} pycall_t;

/* `c`, a Python route's call, into `f`: 1; 0 when Python answers it instead (the
 * route table changed since: a deploy, its index names another route now; or a field
 * is not what serve made); -1 a Python error (TypeError: not serve's tuple). */
static int read_call(Lane *l, PyObject *c, pycall_t *f) {
    if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 17) {
        PyErr_SetString(PyExc_TypeError, "a call is the tuple serve made");
        return -1;
    }
    unsigned long long gen = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(c, 2));
    f->ri = PyLong_AsLong(PyTuple_GET_ITEM(c, 3));
    PyObject *id = PyTuple_GET_ITEM(c, 4);
    f->rid = PyBytes_Check(id) ? PyBytes_AS_STRING(id) : NULL;
    f->rid_len = f->rid ? (size_t)PyBytes_GET_SIZE(id) : 0;
    f->counter = f->rid ? 0 : PyLong_AsUnsignedLongLong(id);
    f->verdict = PyLong_AsLong(PyTuple_GET_ITEM(c, 5));
    f->method = PyLong_AsLong(PyTuple_GET_ITEM(c, 6));
    f->bytes_in = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(c, 13));
    f->ts = PyFloat_AsDouble(PyTuple_GET_ITEM(c, 10));
    f->started = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(c, 11));
    f->host = PyTuple_GET_ITEM(c, 7);
    f->query = PyTuple_GET_ITEM(c, 8);
    f->client = PyTuple_GET_ITEM(c, 9);
    f->path = PyTuple_GET_ITEM(c, 14);
    f->limit = PyTuple_GET_ITEM(c, 15);
    f->conn = PyLong_AsLong(PyTuple_GET_ITEM(c, 16));
    if (PyErr_Occurred()) return -1;
    if (gen != l->generation || f->ri < 0 || f->ri >= l->n_routes || f->method < 0 ||
            f->conn < 0 || f->conn > (CONN_HTTP10 | CONN_CLOSE) ||
            f->method >= N_METHODS || !PyBytes_Check(f->host) || !PyBytes_Check(f->query) ||
            !l->routes[f->ri].python || (f->rid && (f->rid_len == 0 || f->rid_len > 128)) ||
            (f->path != Py_None && !PyBytes_Check(f->path)) ||
            (f->limit != Py_None && !PyBytes_Check(f->limit)))
        return 0;
    f->r = &l->routes[f->ri];
    return 1;
}

/* The response to `f` (status, `count` pairs in the ABI's layout, body) as the front
 * writes it, its record appended to `events`; None when Python answers it instead
 * (the HTTP cache would store it: a GET with Cache-Control or Expires). */
static PyObject *respond_call(Lane *l, const pycall_t *f, uint32_t status,
                              const uint8_t *pairs, uint32_t count, const uint8_t *body,
                              uint32_t body_len, PyObject *date, PyObject *extra,
                              PyObject *events) {
    if (f->r->cache == CACHE_FIRST && f->method == MC_GET && may_store(pairs, count))
        Py_RETURN_NONE;  /* http_cache stores it: Python's */
    char made[96];
    size_t rid_len = f->rid ? f->rid_len : request_id(l, f->counter, made);
    l->out_len = 0;
    l->limit_head = f->limit == Py_None ? NULL : Py_NewRef(f->limit);
    int unwritten = write_response(l, f->r, status, pairs, count, body, body_len,
                                   f->rid ? f->rid : made, rid_len, date, extra,
                                   (int)f->method, (int)f->conn);
    Py_CLEAR(l->limit_head);
    if (unwritten) return PyErr_NoMemory();
    if (add_record(events, f->ts, f->counter, f->rid, rid_len, (int)f->ri, status,
                   f->method == MC_HEAD ? 0 : body_len,
                   mono_ns() - f->started, (int)f->verdict, (int)f->method,
                   PyBytes_AS_STRING(f->host), (size_t)PyBytes_GET_SIZE(f->host),
                   PyBytes_AS_STRING(f->query), (size_t)PyBytes_GET_SIZE(f->query),
                   f->client, f->bytes_in,
                   f->path == Py_None ? NULL : PyBytes_AS_STRING(f->path),
                   f->path == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(f->path), NULL))
        return NULL;
    return PyBytes_FromStringAndSize((const char *)l->out, (Py_ssize_t)l->out_len);
}

/* respond(call, status, headers, body, date, extra_head, events) -> bytes or None:
 * the response to a Python route's `call` (serve's) as the front writes it, its
 * record appended to `events` (a `Records`); None when Python answers it instead: the route
 * table changed since (a deploy: its index names another route now), or the
 * HTTP cache would store the answer (a GET with Cache-Control or Expires), or the
 * headers are not the decoded (name, value) bytes pairs. */
static PyObject *Lane_respond(Lane *l, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 7 || !PyList_Check(a[2]) || !PyBytes_Check(a[3]) || !PyBytes_Check(a[4]) ||
            !PyBytes_Check(a[5]) || !is_records(a[6])) {
        PyErr_SetString(PyExc_TypeError,
                        "respond(call, status, headers, body, date, extra_head, events)");
        return NULL;
    }
    pycall_t f;
    int ok = read_call(l, a[0], &f);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
    long status = PyLong_AsLong(a[1]);
    if (status == -1 && PyErr_Occurred()) return NULL;
    if (status < 200 || status > 599) Py_RETURN_NONE;
    /* the headers in the ABI's layout (what write_response reads), into l->req */
    PyObject *hs = a[2];
    Py_ssize_t count = PyList_GET_SIZE(hs);
    size_t need = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2 ||
                !PyBytes_Check(PyTuple_GET_ITEM(h, 0)) || !PyBytes_Check(PyTuple_GET_ITEM(h, 1)))
            Py_RETURN_NONE;
        need += 8 + (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 0)) +
                (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(h, 1));
    }
    if (count > UINT32_MAX || grow(&l->req, &l->req_cap, need + 1)) return PyErr_NoMemory();
    uint8_t *o = l->req;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *h = PyList_GET_ITEM(hs, i);
        PyObject *k = PyTuple_GET_ITEM(h, 0), *v = PyTuple_GET_ITEM(h, 1);
        o = put_str(o, PyBytes_AS_STRING(k), (uint32_t)PyBytes_GET_SIZE(k));
        o = put_str(o, PyBytes_AS_STRING(v), (uint32_t)PyBytes_GET_SIZE(v));
    }
    PyObject *body = a[3];
    return respond_call(l, &f, (uint32_t)status, l->req, (uint32_t)count,
                        (const uint8_t *)PyBytes_AS_STRING(body),
                        (uint32_t)PyBytes_GET_SIZE(body), a[4], a[5], a[6]);
}

/* respond_frame(call, frame, max_body, date, extra_head, events) -> bytes or None:
 * `respond` of the guest's RESPONSE frame payload `frame` (the function ABI's
 * response) as it came, not decoded in Python first; None also when the frame is
 * not as abi.decode_response takes it, or its body is over `max_body` bytes
 * (Python decodes it and says what is wrong). */
static PyObject *Lane_respond_frame(Lane *l, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 6 || !PyBytes_Check(a[1]) || !PyBytes_Check(a[3]) || !PyBytes_Check(a[4]) ||
            !is_records(a[5])) {
        PyErr_SetString(PyExc_TypeError,
                        "respond_frame(call, frame, max_body, date, extra_head, events)");
        return NULL;
    }
    long long max_body = PyLong_AsLongLong(a[2]);
    if (max_body == -1 && PyErr_Occurred()) return NULL;
    pycall_t f;
    int ok = read_call(l, a[0], &f);
    if (ok <= 0) return ok < 0 ? NULL : Py_NewRef(Py_None);
    uint32_t status, count, body_len = 0;
    const uint8_t *body = NULL;
    const uint8_t *pairs = check_frame((const uint8_t *)PyBytes_AS_STRING(a[1]),
                                       (uint64_t)PyBytes_GET_SIZE(a[1]), &status, &count,
                                       &body, &body_len);
    if (!pairs || (long long)body_len > max_body) Py_RETURN_NONE;
    return respond_call(l, &f, status, pairs, count, body, body_len, a[3], a[4], a[5]);
}

/* commands(run, result_size, guest_begin, guest_end, principals): the address of
 * wasi.c's edgefn_wasi_run and the size of its result (edgefn_wasi_result_size(),
 * checked against `wasi_result`), reactor.c's ticker marks, and per bot class the
 * principal variable a command gets (b"EDGEFN_PRINCIPAL_BOT\0<class>\0"): routes with
 * a `cgi` are run here from then on. */
static PyObject *Lane_commands(Lane *l, PyObject *args) {
    unsigned long long run, size, begin, end;
    PyObject *principals;
    if (!PyArg_ParseTuple(args, "KKKKO!", &run, &size, &begin, &end, &PyTuple_Type,
                          &principals))
        return NULL;
    if (!run || !begin || !end || size != sizeof(wasi_result) ||
            PyTuple_GET_SIZE(principals) != PyTuple_GET_SIZE(l->class_blobs)) {
        PyErr_SetString(PyExc_ValueError, "commands: three addresses, wasi.c's result "
                        "layout, a principal per class");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(principals); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(principals, i))) {
            PyErr_SetString(PyExc_TypeError, "commands: principals are bytes");
            return NULL;
        }
    Py_XSETREF(l->principals, Py_NewRef(principals));
    l->wasi_run = (wasi_run_t)(uintptr_t)run;
    l->guest_begin = (guest_mark_t)(uintptr_t)begin;
    l->guest_end = (guest_mark_t)(uintptr_t)end;
    Py_RETURN_NONE;
}

/* limiter(admits, count): ratelimit's, for the requests of limited routes:
 * `admits(route index, client)` -> a 3-tuple (admitted now: `count`'s arguments), on a
 * route the lane refuses on a 4-tuple (refused, counted: `refuse`), or None (Python's);
 * `count(*that tuple)` -> the header lines to add (bytes), once the request is answered. */
static PyObject *Lane_limiter(Lane *l, PyObject *args) {
    PyObject *admits, *count;
    if (!PyArg_ParseTuple(args, "OO:limiter", &admits, &count)) return NULL;
    if (!PyCallable_Check(admits) || !PyCallable_Check(count)) {
        PyErr_SetString(PyExc_TypeError, "limiter(admits, count): two callables");
        return NULL;
    }
    Py_XSETREF(l->limit_admits, Py_NewRef(admits));
    Py_XSETREF(l->limit_count, Py_NewRef(count));
    Py_RETURN_NONE;
}

/* `*slot` = `fn`, a callable (TypeError saying `usage` otherwise): the setters' step. */
static PyObject *set_callable(PyObject **slot, PyObject *fn, const char *usage) {
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    Py_XSETREF(*slot, Py_NewRef(fn));
    Py_RETURN_NONE;
}

/* python(submit): what runs a Python route's request (`python_call`). */
static PyObject *Lane_python(Lane *l, PyObject *submit) {
    return set_callable(&l->submit, submit, "python(submit): a callable");
}

static void clear_routes(Lane *l) {
    for (int i = 0; i < l->n_routes; i++) {
        route_t *r = &l->routes[i];
        Py_CLEAR(r->env_blob);
        Py_CLEAR(r->label);
        Py_CLEAR(r->fn);
        Py_CLEAR(r->caching);
        Py_CLEAR(r->label_str);
        Py_CLEAR(r->executor);
        Py_CLEAR(r->python);
        Py_CLEAR(r->cgi);
        Py_CLEAR(r->cgi_route);
        Py_CLEAR(r->excluded);
        Py_CLEAR(r->guard);
    }
    l->n_routes = 0;
    l->generation++;
}

static void clear_uas(Lane *l) {
    for (size_t i = 0; i < UA_SLOTS; i++) Py_CLEAR(l->uas[i].ua);
    l->n_uas = 0;
}

/* `r`'s path split into its segments (a pattern route's; a last `*` sets `wildcard`):
 * 0, -1 when it is no '/'-separated list of at most MAX_SEGMENTS non-empty segments
 * (a `*` only last, and something besides "/"). */
static int split_pattern(route_t *r) {
    size_t at = 0;
    r->nseg = 0;
    r->wildcard = 0;
    while (at < r->path_len) {
        if (r->path[at] != '/' || r->wildcard || r->nseg == MAX_SEGMENTS) return -1;
        size_t start = ++at;
        while (at < r->path_len && r->path[at] != '/') at++;
        if (at == start) return -1;
        if (at - start == 1 && r->path[start] == '*') {  /* the last segment, or refused */
            r->wildcard = 1;
            continue;
        }
        r->seg[r->nseg].at = (uint32_t)start;
        r->seg[r->nseg].len = (uint32_t)(at - start);
        r->seg[r->nseg++].capture = r->path[start] == ':' && at - start > 1;
    }
    return r->nseg || r->wildcard ? 0 : -1;
}

/* Whether `x` is a route's exclusions: a tuple of (bytes, EX_*); else a ValueError. */
static int exclusions_ok(PyObject *x) {
    if (PyTuple_Check(x)) {
        Py_ssize_t i = 0;
        for (; i < PyTuple_GET_SIZE(x); i++) {
            PyObject *e = PyTuple_GET_ITEM(x, i);
            if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) != 2 ||
                    !PyBytes_Check(PyTuple_GET_ITEM(e, 0)) ||
                    !PyLong_Check(PyTuple_GET_ITEM(e, 1)))
                break;
            long kind = PyLong_AsLong(PyTuple_GET_ITEM(e, 1));
            if (kind < EX_PATH || kind >= EX_SEGMENT + MAX_SEGMENTS) break;
        }
        if (i == PyTuple_GET_SIZE(x)) return 1;
    }
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "exclusions: a tuple of (bytes, 0..18)");
    return 0;
}

/* routes(list of (path, engine, pre, memory_limit, deadline_ticks, max_response, times,
 * env_blob, label, fn, allowed, cache, origin, caching, label_str, executor, python[,
 * cgi[, excluded[, blocked[, guard]]]]): the eligible routes, replacing the ones before
 * (`blocked`: a bit per bot class whose requests get bots' 403 from the lane, `block`;
 * `guard`: auth's 401 to a request without a credential, `guarded`; `origin`: ROUTE_*
 * flags, ROUTE_ORIGIN when a request with an Origin header is Python's, ROUTE_PREFIX
 * when the route serves the paths under it but `excluded`'s, a tuple of (path, EX_*); `caching`: a set, for CACHE_FIRST;
 * `python`: None for a WASM reactor, what a Python function's call carries for Python's
 * finish; `cgi`: for a WASI command the C may run itself (`commands`), (argv[0] and the
 * manifest env as NUL-ended strings, the env's pair count, X_MATCHED_ROUTE), its engine,
 * pre, memory_limit, deadline_ticks (its inline run's) and max_response set too, and a
 * `python` for what it leaves). At most MAX_ROUTES (ValueError past it). */
static PyObject *Lane_routes(Lane *l, PyObject *list) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) > MAX_ROUTES) {
        PyErr_Format(PyExc_ValueError, "routes: a list of at most %d", MAX_ROUTES);
        return NULL;
    }
    clear_routes(l);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        route_t *r = &l->routes[i];
        const char *path;
        Py_ssize_t path_len;
        PyObject *env, *label, *fn, *caching, *label_str, *executor, *python, *cgi = Py_None,
                 *excl = Py_None, *guard = Py_None;
        unsigned long long engine, pre, times, ticks, max_response;
        long long memory;
        unsigned int allowed, blocked = 0;
        int cache, origin;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(list, i), "y#KKLKKKSSOIiiOUOO|OOIO", &path,
                              &path_len, &engine, &pre, &memory, &ticks, &max_response, &times,
                              &env, &label, &fn, &allowed, &cache, &origin, &caching,
                              &label_str, &executor, &python, &cgi, &excl, &blocked, &guard))
            return NULL;
        if (guard != Py_None && (!PyTuple_Check(guard) || PyTuple_GET_SIZE(guard) != 4 ||
                                 python != Py_None || cgi != Py_None ||
                                 (origin & ROUTE_LIMITED))) {
            PyErr_SetString(PyExc_ValueError, "a guard: a refusal (a 4-tuple), on a route "
                            "neither called, run nor limited");
            return NULL;
        }
        if (excl != Py_None && !exclusions_ok(excl)) return NULL;
        PyObject *strings = NULL, *matched = NULL;
        unsigned int envc = 0;
        if (cgi != Py_None && (!PyArg_ParseTuple(cgi, "SIS", &strings, &envc, &matched) ||
                               python == Py_None || !engine || !pre)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "a command's route needs python, engine, pre");
            return NULL;
        }
        if (cache < CACHE_NONE || cache > CACHE_FIRST ||
                (cache == CACHE_FIRST && !PyAnySet_Check(caching))) {
            PyErr_SetString(PyExc_ValueError, "cache: 0, 1 or 2 (2 with a set)");
            return NULL;
        }
        if (python != Py_None && !l->submit) {
            PyErr_SetString(PyExc_ValueError, "a Python route before python(submit)");
            return NULL;
        }
        if ((size_t)path_len >= sizeof r->path) {
            PyErr_SetString(PyExc_ValueError, "route path longer than 255 bytes");
            return NULL;
        }
        memcpy(r->path, path, (size_t)path_len);
        r->path_len = (size_t)path_len;
        r->pattern = (origin & ROUTE_PATTERN) != 0;
        r->nseg = 0;
        r->wildcard = 0;
        if (r->pattern && split_pattern(r)) {
            r->pattern = r->wildcard = 0;
            PyErr_SetString(PyExc_ValueError, "a pattern route: '/'-separated segments, at "
                            "most 16, each non-empty (a capture ':name'), a `*` only last");
            return NULL;
        }
        r->engine = (void *)(uintptr_t)engine;
        r->pre = (void *)(uintptr_t)pre;
        r->times = (void *)(uintptr_t)times;
        r->memory_limit = memory;
        r->deadline_ticks = ticks;
        r->max_response = max_response;
        r->env_blob = Py_NewRef(env);
        r->label = Py_NewRef(label);
        r->fn = Py_NewRef(fn);
        r->allowed = allowed;
        r->blocked = blocked & ~allowed;
        r->guard = guard == Py_None ? NULL : Py_NewRef(guard);
        r->guard_counts = r->guard && (origin & ROUTE_GUARD_COUNTS) != 0;
        r->cache = cache;
        r->origin = (origin & ROUTE_ORIGIN) != 0;
        r->prefix = (origin & ROUTE_PREFIX) != 0;
        r->limited = (origin & ROUTE_LIMITED) != 0;
        r->refuses = r->limited && (origin & ROUTE_REFUSES) != 0;
        r->excluded = excl == Py_None ? NULL : Py_NewRef(excl);
        r->caching = Py_NewRef(caching);
        r->label_str = Py_NewRef(label_str);
        r->executor = Py_NewRef(executor);
        r->python = python == Py_None ? NULL : Py_NewRef(python);
        r->cgi = strings ? Py_NewRef(strings) : NULL;
        r->cgi_envc = envc;
        r->cgi_route = matched ? Py_NewRef(matched) : NULL;
        l->n_routes = (int)i + 1;
    }
    Py_RETURN_NONE;
}

/* verdicts(classes): the bot class of each verdict `classify` may return (a tuple of
 * indexes into class_blobs), replacing the last. */
static PyObject *Lane_verdicts(Lane *l, PyObject *classes) {
    if (!PyTuple_Check(classes)) {
        PyErr_SetString(PyExc_TypeError, "verdicts(tuple of class indexes)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(classes); i++) {
        PyObject *x = PyTuple_GET_ITEM(classes, i);
        long c = PyLong_Check(x) ? PyLong_AsLong(x) : -1;
        if (c < 0 || c >= PyTuple_GET_SIZE(l->class_blobs)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "verdict classes index class_blobs");
            return NULL;
        }
    }
    if (PyTuple_GET_SIZE(classes) < PyTuple_GET_SIZE(l->verdict_class))
        clear_uas(l);  /* fewer verdicts: the User-Agents' indexes are asked again */
    Py_XSETREF(l->verdict_class, Py_NewRef(classes));
    Py_RETURN_NONE;
}

/* blocks(tuple): per verdict, bots' refusal of it, as `refuse` takes a refusal (status,
 * header lines, body, (decisions, error)), or None (Python's): what `block` writes for a
 * verdict whose class a route blocks. */
static PyObject *Lane_blocks(Lane *l, PyObject *blocks) {
    if (!PyTuple_Check(blocks)) {
        PyErr_SetString(PyExc_TypeError, "blocks(tuple of refusals or None, by verdict)");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(blocks); i++) {
        PyObject *x = PyTuple_GET_ITEM(blocks, i);
        if (x != Py_None && (!PyTuple_Check(x) || PyTuple_GET_SIZE(x) != 4)) {
            PyErr_SetString(PyExc_ValueError, "a verdict's block: a refusal (a 4-tuple) or None");
            return NULL;
        }
    }
    Py_XSETREF(l->blocks, Py_NewRef(blocks));
    Py_RETURN_NONE;
}

/* guard_ask(callable): how a guarded route whose refusal ratelimit counts is refused
 * (`guarded`): callable(route index, client) -> a refusal. */
static PyObject *Lane_guard_ask(Lane *l, PyObject *ask) {
    return set_callable(&l->guard_ask, ask, "guard_ask(callable)");
}

static PyObject *Lane_forget_agents(Lane *l, PyObject *unused) {
    (void)unused;
    clear_uas(l);
    Py_RETURN_NONE;
}

static PyObject *Lane_next(Lane *l) { return PyLong_FromUnsignedLongLong(++l->counter); }

static PyObject *Lane_iter(PyObject *self) { return Py_NewRef(self); }

static int load_llhttp(const char *so) {
    void *h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(so, RTLD_NOW);
    if (!h) return -1;
#define SYM(var, name) if (!(*(void **)&var = dlsym(h, name))) return -1
    SYM(ll_init, "llhttp_init");
    SYM(ll_settings_init, "llhttp_settings_init");
    SYM(ll_execute, "llhttp_execute");
    SYM(ll_resume, "llhttp_resume");
    SYM(ll_error_pos, "llhttp_get_error_pos");
    SYM(ll_should_keep_alive, "llhttp_should_keep_alive");
    SYM(ll_get_method, "llhttp_get_method");
    SYM(ll_get_http_major, "llhttp_get_http_major");
    SYM(ll_get_http_minor, "llhttp_get_http_minor");
#undef SYM
    ll_settings_init(&SETTINGS);
    SETTINGS.on_message_begin = on_message_begin;
    SETTINGS.on_url = on_url;
    SETTINGS.on_header_field = on_header_field;
    SETTINGS.on_header_value = on_header_value;
    SETTINGS.on_headers_complete = on_headers_complete;
    SETTINGS.on_body = on_body;
    SETTINGS.on_message_complete = on_message_complete;
    return 0;
}

/* Lane(httptools_so, reactor_entry, trap_delete, error_delete, result_size, class_blobs,
 *      verdict_class, classify, status_lines, prefix, rid_header, max_url, max_head
 *      [, max_body, trust_incoming, foreign_credentials]) */
static int Lane_init(Lane *l, PyObject *args, PyObject *kw) {
    (void)kw;
    const char *so, *prefix, *rid;
    Py_ssize_t prefix_len, rid_len;
    unsigned long long entry, trap_delete, error_delete, max_url, max_head, max_body = 0;
    Py_ssize_t result_size;
    PyObject *blobs, *classes, *classify, *lines;
    int trust = 0, foreign = 0;
    if (!PyArg_ParseTuple(args, "sKKKnO!O!OO!y#y#KK|Kpp", &so, &entry, &trap_delete,
                          &error_delete, &result_size, &PyTuple_Type,
                          &blobs, &PyTuple_Type, &classes, &classify, &PyTuple_Type, &lines,
                          &prefix, &prefix_len, &rid, &rid_len, &max_url, &max_head,
                          &max_body, &trust, &foreign))
        return -1;
    if (result_size != (Py_ssize_t)sizeof(edgefn_result)) {
        PyErr_SetString(PyExc_RuntimeError, "edgefn_result layout differs from reactor.c's");
        return -1;
    }
    if (PyTuple_GET_SIZE(lines) != 600 || (size_t)prefix_len >= 40 || rid_len == 0 ||
            (size_t)rid_len >= sizeof l->rid_header || !PyCallable_Check(classify)) {
        PyErr_SetString(PyExc_ValueError, "status_lines: 600; prefix < 40 bytes; "
                                          "rid_header 1..63 bytes; classify callable");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lines); i++) {
        PyObject *x = PyTuple_GET_ITEM(lines, i);
        if (x != Py_None && !PyBytes_Check(x)) {
            PyErr_SetString(PyExc_TypeError, "status lines: bytes or None");
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(blobs); i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(blobs, i))) {
            PyErr_SetString(PyExc_TypeError, "class blobs: bytes");
            return -1;
        }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(classes); i++) {
        long c = PyLong_Check(PyTuple_GET_ITEM(classes, i))
                     ? PyLong_AsLong(PyTuple_GET_ITEM(classes, i)) : -1;
        if (c < 0 || c >= PyTuple_GET_SIZE(blobs)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "verdict classes index class_blobs");
            return -1;
        }
    }
    if (!ll_init && load_llhttp(so)) {
        PyErr_Format(PyExc_RuntimeError, "llhttp from %s: %s", so, dlerror());
        return -1;
    }
    if (!entry || !trap_delete || !error_delete) {
        PyErr_SetString(PyExc_ValueError, "reactor_entry, trap_delete, error_delete: addresses");
        return -1;
    }
    l->call = (reactor_call_t)(uintptr_t)entry;
    l->trap_delete = (delete_t)(uintptr_t)trap_delete;
    l->error_delete = (delete_t)(uintptr_t)error_delete;
    Py_XSETREF(l->class_blobs, Py_NewRef(blobs));
    Py_XSETREF(l->verdict_class, Py_NewRef(classes));
    Py_XSETREF(l->classify, Py_NewRef(classify));
    Py_XSETREF(l->status_lines, Py_NewRef(lines));
    Py_XSETREF(l->inflight_name, PyUnicode_InternFromString("inflight"));
    Py_XSETREF(l->threaded_name, PyUnicode_InternFromString("threaded"));
    Py_XSETREF(l->lane_cut_name, PyUnicode_InternFromString("lane_cut"));
    if (!l->inflight_name || !l->threaded_name || !l->lane_cut_name) return -1;
    memcpy(l->prefix, prefix, (size_t)prefix_len);
    l->prefix_len = (size_t)prefix_len;
    for (Py_ssize_t i = 0; i < rid_len; i++)
        l->rid_header[i] = (char)(rid[i] >= 'A' && rid[i] <= 'Z' ? rid[i] + 32 : rid[i]);
    l->rid_header_len = (size_t)rid_len;
    l->max_url = max_url;
    l->max_head = max_head;
    l->q.max_body = max_body < BODY_MAX ? max_body : BODY_MAX;  /* 0 (not given): no bodies */
    l->trust = trust;
    l->foreign = foreign;
    return 0;
}

static int Lane_traverse(Lane *l, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(l));
    Py_VISIT(l->class_blobs);
    Py_VISIT(l->verdict_class);
    Py_VISIT(l->blocks);
    Py_VISIT(l->guard_ask);
    Py_VISIT(l->classify);
    Py_VISIT(l->status_lines);
    for (int i = 0; i < l->n_routes; i++) {
        Py_VISIT(l->routes[i].fn);
        Py_VISIT(l->routes[i].caching);
        Py_VISIT(l->routes[i].excluded);
        Py_VISIT(l->routes[i].executor);
        Py_VISIT(l->routes[i].python);
        Py_VISIT(l->routes[i].guard);
    }
    Py_VISIT(l->submit);
    Py_VISIT(l->started);
    Py_VISIT(l->limit_admits);
    Py_VISIT(l->limit_count);
    Py_VISIT(l->limit_token);
    Py_VISIT(l->limit_head);
    return 0;
}

static int Lane_clear(Lane *l) {
    Py_CLEAR(l->class_blobs);
    Py_CLEAR(l->verdict_class);
    Py_CLEAR(l->blocks);
    Py_CLEAR(l->guard_ask);
    Py_CLEAR(l->classify);
    Py_CLEAR(l->status_lines);
    Py_CLEAR(l->inflight_name);
    Py_CLEAR(l->threaded_name);
    Py_CLEAR(l->lane_cut_name);
    Py_CLEAR(l->submit);
    Py_CLEAR(l->started);
    Py_CLEAR(l->limit_admits);
    Py_CLEAR(l->limit_count);
    Py_CLEAR(l->limit_token);
    Py_CLEAR(l->limit_head);
    Py_CLEAR(l->principals);
    clear_routes(l);
    clear_uas(l);
    return 0;
}

static void Lane_dealloc(Lane *l) {
    PyTypeObject *tp = Py_TYPE(l);
    PyObject_GC_UnTrack(l);
    Lane_clear(l);
    free(l->req);
    free(l->out);
    free(l->cgi);
    tp->tp_free((PyObject *)l);
    Py_DECREF(tp);
}

static PyObject *Lane_get_counter(Lane *l, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(l->counter);
}

static PyObject *Lane_get_commands_run(Lane *l, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(l->commands_run);
}

static PyObject *Lane_get_waiting(Lane *l, void *c) {
    (void)c;
    return PyLong_FromUnsignedLongLong(l->waiting);
}

static PyObject *Lane_get_closing(Lane *l, void *c) {
    (void)c;
    return PyBool_FromLong(l->closing);
}

static PyObject *Lane_get_size(Lane *l, void *c) {
    (void)c;
    return PyLong_FromLong(l->n_routes);
}

/* layout_check() -> (err, method field, method accessor, major, minor, major accessor,
 * minor accessor, keep_alive): a known request parsed with a bare parser. */
static int PROBE_KEEP_ALIVE = -1;
static int probe_complete(llhttp_t *p) { PROBE_KEEP_ALIVE = ll_should_keep_alive(p); return 0; }

static PyObject *layout_check(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    if (!ll_init) { PyErr_SetString(PyExc_RuntimeError, "no Lane made yet"); return NULL; }
    static const char REQ_[] = "PUT /x HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n";
    llhttp_settings_t s;
    llhttp_t p;
    ll_settings_init(&s);
    s.on_message_complete = probe_complete;
    ll_init(&p, HTTP_REQUEST, &s);
    int err = ll_execute(&p, REQ_, sizeof REQ_ - 1);
    return Py_BuildValue("(iiiiiiii)", err, p.method, ll_get_method(&p), p.http_major,
                         p.http_minor, ll_get_http_major(&p), ll_get_http_minor(&p),
                         PROBE_KEEP_ALIVE);
}

static PyMethodDef LANE_METHODS[] = {
    {"serve", (PyCFunction)(void (*)(void))Lane_serve, METH_FASTCALL,
     "serve(data, date, extra_head, budget, events, client) -> (used, out, call)"},
    {"respond", (PyCFunction)(void (*)(void))Lane_respond, METH_FASTCALL,
     "respond(call, status, headers, body, date, extra_head, events) -> bytes or None"},
    {"respond_frame", (PyCFunction)(void (*)(void))Lane_respond_frame, METH_FASTCALL,
     "respond_frame(call, frame, max_body, date, extra_head, events) -> bytes or None"},
    {"python", (PyCFunction)Lane_python, METH_O, "python(submit): how Python routes run"},
    {"limiter", (PyCFunction)Lane_limiter, METH_VARARGS,
     "limiter(admits, count): how limited routes' requests are asked and counted"},
    {"commands", (PyCFunction)Lane_commands, METH_VARARGS,
     "commands(run, result_size, guest_begin, guest_end, principals): WASI commands "
     "run here"},
    {"routes", (PyCFunction)Lane_routes, METH_O, "replace the eligible routes"},
    {"verdicts", (PyCFunction)Lane_verdicts, METH_O, "replace the verdicts' classes"},
    {"blocks", (PyCFunction)Lane_blocks, METH_O, "replace the verdicts' blocks (bots' 403s)"},
    {"guard_ask", (PyCFunction)Lane_guard_ask, METH_O,
     "how a guarded route's counted refusal is asked"},
    {"forget_agents", (PyCFunction)Lane_forget_agents, METH_NOARGS,
     "drop the User-Agent verdicts learnt"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef LANE_GETSET[] = {
    {"counter", (getter)Lane_get_counter, NULL, "the last request id number given", NULL},
    {"size", (getter)Lane_get_size, NULL, "routes served", NULL},
    {"closing", (getter)Lane_get_closing, NULL,
     "whether the last request the last serve took was not kept alive: the connection "
     "closes once its answer is written (a Python call's: once it is answered)", NULL},
    {"waiting", (getter)Lane_get_waiting, NULL,
     "the body bytes the request the last serve stopped at still needs, when the lane "
     "waits for them (0: it is Python's)", NULL},
    {"commands_run", (getter)Lane_get_commands_run, NULL,
     "requests to WASI commands the C ran and answered itself", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot LANE_SLOTS[] = {
    {Py_tp_init, Lane_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Lane_dealloc},
    {Py_tp_traverse, Lane_traverse},
    {Py_tp_clear, Lane_clear},
    {Py_tp_iter, Lane_iter},
    {Py_tp_iternext, Lane_next},
    {Py_tp_methods, LANE_METHODS},
    {Py_tp_getset, LANE_GETSET},
    {0, NULL}};

static PyType_Spec LANE_SPEC = {"_edgefn_lane.Lane", sizeof(Lane), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, LANE_SLOTS};

/* ---- the drain: records -> events, access-log lines, metric groups ---------------------- */
#include "lane_drain.c.h"

/* cgi_frame(output) -> the response frame the lane writes for a command's `output`, or
 * None where it leaves the answer to wasi.parse_response (tests compare the two). */
static PyObject *py_cgi_frame(PyObject *m, PyObject *output) {
    (void)m;
    if (!PyBytes_Check(output)) {
        PyErr_SetString(PyExc_TypeError, "cgi_frame(bytes)");
        return NULL;
    }
    uint8_t *buf = NULL;
    size_t cap = 0;
    long n = cgi_frame(&buf, &cap, (const uint8_t *)PyBytes_AS_STRING(output),
                       (size_t)PyBytes_GET_SIZE(output));
    PyObject *got = n > 0 ? PyBytes_FromStringAndSize((const char *)buf, n)
                  : n == 0 ? Py_NewRef(Py_None) : PyErr_NoMemory();
    free(buf);
    return got;
}

static PyMethodDef METHODS[] = {
    {"cgi_frame", (PyCFunction)py_cgi_frame, METH_O,
     "cgi_frame(output): a command's answer as the lane writes it, or None: Python's"},
    {"layout_check", layout_check, METH_NOARGS, "llhttp's struct against its accessors"},
    {NULL, NULL, 0, NULL}};

static int exec_module(PyObject *m) {
    PyObject *t = PyType_FromModuleAndSpec(m, &LANE_SPEC, NULL);
    if (!t) return -1;
    int err = PyModule_AddObjectRef(m, "Lane", t);
    Py_DECREF(t);
    if (err) return -1;
    t = PyType_FromModuleAndSpec(m, &MAKER_SPEC, NULL);
    if (!t) return -1;
    err = PyModule_AddObjectRef(m, "EventMaker", t);
    Py_DECREF(t);
    if (err) return -1;
    t = PyType_FromModuleAndSpec(m, &RECORDS_SPEC, NULL);
    if (!t) return -1;
    err = PyModule_AddObjectRef(m, "Records", t);
    Py_DECREF(t);
    return err;
}

static PyModuleDef_Slot SLOTS[] = {{Py_mod_exec, exec_module}, {0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_edgefn_lane",
    "edgefn's native lane (runtime/net/lane.py)", 0, METHODS, SLOTS, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__edgefn_lane(void) {
    const char *extra = "!#$%&'*+-.^_`|~";
    for (int c = '0'; c <= '9'; c++) TCHAR[c] = 1;
    for (int c = 'a'; c <= 'z'; c++) TCHAR[c] = TCHAR[c - 32] = 1;
    for (const char *c = extra; *c; c++) TCHAR[(unsigned char)*c] = 1;
    return PyModuleDef_Init(&MODULE);
}
