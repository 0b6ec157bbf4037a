/*
 * PROTOTYPE, bench only: the PoP does not use this file. A native data plane
 * ("native lane") for requests no Python stage needs, built and driven by
 * bench/_native_lane.py (see its docstring for how to run it).
 *
 * A CPython extension `_native_lane`. Its `Conn` holds one connection's llhttp
 * parser (llhttp 9.3, the one httptools 0.9.0 vendors: its C API is dlsym'd from
 * httptools' own extension, the layouts below are that release's public header,
 * checked against the disassembly of that .so and, at run time, by
 * `layout_check()`), its per-request scratch and its unsent output. For each
 * request, from the bytes a read brought:
 *
 *   parse (llhttp) -> the front's cheap checks -> route (exact path) -> encode the
 *   request into the function ABI (edgefn_core/abi.py) -> the PoP's own C entry
 *   `edgefn_reactor_call` (runtime/executors/wasm/native_src/reactor.c, passed in
 *   as a function pointer) -> decode the guest's response -> HTTP/1.1 response
 *   bytes with the PoP's headers (date, x-edgefn-function, x-edgefn-cache,
 *   x-request-id) -> [optional] a fixed-size event record and an access-log line
 *   appended to C buffers that Python drains once per loop turn.
 *
 * Whatever the lane does not handle (an unknown path, an odd request, a failed
 * call) goes back to Python as a tuple, in order; so does every request in mode 0
 * (variant a: Python runs the reactor call and `respond()` writes the answer).
 * Responses wait in the Conn until `flush()` (scheduled once per loop turn with
 * loop.call_soon, like runtime/net/protocol.py's Outbox) writes each connection's
 * in one transport.write.
 *
 * Not done (a prototype): timeouts, backpressure, max sizes beyond fixed
 * buffers, streaming, host-bound routes, 100-continue, upgrades (answered 400).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ---- llhttp 9.3 ------------------------------------------------------------------------ */
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
/* offsets read off httptools 0.9.0's llhttp_get_* / llhttp_init / llhttp_reset */
_Static_assert(offsetof(llhttp_t, data) == 0x30, "llhttp data");
_Static_assert(offsetof(llhttp_t, type) == 0x48, "llhttp type");
_Static_assert(offsetof(llhttp_t, method) == 0x49, "llhttp method");
_Static_assert(offsetof(llhttp_t, http_minor) == 0x4b, "llhttp http_minor");
_Static_assert(offsetof(llhttp_t, lenient_flags) == 0x4e, "llhttp lenient_flags");
_Static_assert(offsetof(llhttp_t, upgrade) == 0x50, "llhttp upgrade");
_Static_assert(offsetof(llhttp_t, status_code) == 0x54, "llhttp status_code");
_Static_assert(offsetof(llhttp_t, settings) == 0x58, "llhttp settings");
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
/* llhttp__on_url loads settings+0x10, on_header_value +0x38, on_message_complete +0x60,
 * on_reset +0xc0 in that .so */
_Static_assert(offsetof(llhttp_settings_t, on_url) == 0x10, "settings on_url");
_Static_assert(offsetof(llhttp_settings_t, on_header_value) == 0x38, "settings value");
_Static_assert(offsetof(llhttp_settings_t, on_headers_complete) == 0x50, "settings hc");
_Static_assert(offsetof(llhttp_settings_t, on_message_complete) == 0x60, "settings mc");
_Static_assert(offsetof(llhttp_settings_t, on_reset) == 0xc0, "settings reset");

enum { HPE_OK = 0, HPE_PAUSED_UPGRADE = 22, HTTP_REQUEST = 1, HTTP_HEAD = 2 };

static void (*ll_init)(llhttp_t *, int, const llhttp_settings_t *);
static void (*ll_settings_init)(llhttp_settings_t *);
static int (*ll_execute)(llhttp_t *, const char *, size_t);
static int (*ll_should_keep_alive)(const llhttp_t *);
static uint8_t (*ll_get_method)(llhttp_t *);
static uint8_t (*ll_get_http_major)(llhttp_t *);
static uint8_t (*ll_get_http_minor)(llhttp_t *);
static const char *(*ll_method_name)(int);
static llhttp_settings_t SETTINGS;

/* ---- the PoP's reactor entry (reactor.c) ----------------------------------------------- */
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
typedef int32_t (*reactor_call_t)(void *engine, const void *pre, int64_t memory_limit,
                                  uint64_t deadline_ticks, const uint8_t *req, size_t req_len,
                                  uint64_t max_response, int32_t handle, edgefn_result *r,
                                  void *times);

/* ---- global state ---------------------------------------------------------------------- */
#define MAX_ROUTES 16
typedef struct {
    char path[256];
    size_t path_len;
    reactor_call_t call;
    void *engine, *pre, *times;
    int64_t memory_limit;
    uint64_t deadline_ticks, max_response;
    PyObject *env_blob, *params_blob, *principal_blob, *label;  /* bytes */
    uint64_t served, failed;  /* what a metrics scrape would read */
} route_t;
static route_t ROUTES[MAX_ROUTES];
static int N_ROUTES;
static edgefn_result RESULT;
static uint8_t *REQ;  /* the encoded request */
static size_t REQ_CAP, REQ_LEN;

static char RID_PREFIX[32];
static size_t RID_PREFIX_LEN;
static uint64_t RID_COUNTER;

static time_t DATE_SECOND = -1;
static char DATE_LINE[64];  /* "date: <IMF-fixdate>\r\n" */
static size_t DATE_LEN;

static PyObject *CALL_SOON, *FLUSH;  /* loop.call_soon and this module's flush */
typedef struct Conn Conn;
static Conn **OUTBOX;
static size_t OUTBOX_LEN, OUTBOX_CAP;

typedef struct {  /* one request's event: what the events stage and metrics need */
    double ts;          /* arrival, wall clock */
    uint64_t rid;       /* the counter; the prefix is the process's */
    uint64_t dur_ns;
    uint32_t status, bytes_out, bytes_in;
    uint16_t route, method;
    uint8_t client[16]; /* IPv4-mapped or IPv6 */
} lane_event;
static uint8_t *EVENTS, *LOG;
static size_t EVENTS_LEN, EVENTS_CAP, LOG_LEN, LOG_CAP;
static time_t LOG_SECOND = -1;
static char LOG_STAMP[32];

static const char *reason(int status) {
    switch (status) {
    case 200: return "OK"; case 201: return "Created"; case 204: return "No Content";
    case 301: return "Moved Permanently"; case 302: return "Found";
    case 304: return "Not Modified"; case 400: return "Bad Request";
    case 403: return "Forbidden"; case 404: return "Not Found";
    case 429: return "Too Many Requests"; case 500: return "Internal Server Error";
    case 502: return "Bad Gateway"; case 503: return "Service Unavailable";
    default: return "Unknown";
    }
}

/* ---- growable buffers ------------------------------------------------------------------ */
static int grow(uint8_t **buf, size_t *cap, size_t need) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 4096;
    while (n < need) n *= 2;
    uint8_t *p = realloc(*buf, n);
    if (!p) return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* ---- the connection -------------------------------------------------------------------- */
#define URL_MAX 8192
#define HEAD_MAX 16384
#define MAX_HEADERS 100
#define BODY_MAX (1 << 20)
enum { MODE_C_SERVE = 1, MODE_EVENTS = 2 };

typedef struct { uint32_t name, name_len, value, value_len; } hdr_t;

struct Conn {
    PyObject_HEAD
    llhttp_t p;
    /* per-connection */
    int mode;
    int closing;       /* close once what is waiting is written */
    int in_outbox;
    int to_python;     /* later requests of this read go to Python too: responses in order */
    int error_status;  /* a 4xx the front answers and closes with */
    PyObject *write, *close;  /* the transport's bound methods */
    PyObject *pending;        /* requests for Python, or NULL */
    uint8_t client[16];
    char client_text[48];
    size_t client_text_len;
    uint8_t *out;
    size_t out_len, out_cap;
    /* per-request */
    int hstate;        /* 0: none, 1: in a field, 2: in a value */
    int headers_done;
    uint32_t url_len, head_len, nh;
    uint64_t started_ns;
    double arrived;
    hdr_t h[MAX_HEADERS];
    uint8_t *body;
    size_t body_len, body_cap;
    char url[URL_MAX];
    char head[HEAD_MAX];
};

static uint64_t cpu_ns(void) {  /* this thread's CPU time: preemption is not counted */
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int on_message_begin(llhttp_t *p) {
    Conn *c = p->data;
    c->url_len = c->head_len = c->nh = 0;
    c->hstate = c->headers_done = 0;
    c->body_len = 0;
    if (c->mode & MODE_EVENTS) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        c->arrived = (double)ts.tv_sec + ts.tv_nsec / 1e9;
        c->started_ns = mono_ns();
    }
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n) {
    Conn *c = p->data;
    if (c->url_len + n > URL_MAX) { c->error_status = 414; return -1; }
    memcpy(c->url + c->url_len, at, n);
    c->url_len += (uint32_t)n;
    return 0;
}

static int on_header_field(llhttp_t *p, const char *at, size_t n) {
    Conn *c = p->data;
    if (c->headers_done) return 0;  /* a trailer: never merged into the header section */
    if (c->head_len + n > HEAD_MAX) { c->error_status = 431; return -1; }
    if (c->hstate != 1) {
        if (c->nh == MAX_HEADERS) { c->error_status = 431; return -1; }
        hdr_t *h = &c->h[c->nh++];
        h->name = c->head_len;
        h->name_len = h->value = h->value_len = 0;
        c->hstate = 1;
    }
    char *o = c->head + c->head_len;
    for (size_t i = 0; i < n; i++) o[i] = (char)(at[i] >= 'A' && at[i] <= 'Z' ? at[i] + 32 : at[i]);
    c->head_len += (uint32_t)n;
    c->h[c->nh - 1].name_len += (uint32_t)n;
    return 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t n) {
    Conn *c = p->data;
    if (c->headers_done) return 0;
    if (c->head_len + n > HEAD_MAX) { c->error_status = 431; return -1; }
    hdr_t *h = &c->h[c->nh - 1];
    if (c->hstate != 2) { h->value = c->head_len; c->hstate = 2; }
    memcpy(c->head + c->head_len, at, n);
    c->head_len += (uint32_t)n;
    h->value_len += (uint32_t)n;
    return 0;
}

static int on_headers_complete(llhttp_t *p) {
    Conn *c = p->data;
    c->headers_done = 1;
    if (p->http_major != 1 || p->http_minor > 1) { c->error_status = 505; return -1; }
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t n) {
    Conn *c = p->data;
    if (c->body_len + n > BODY_MAX) { c->error_status = 413; return -1; }
    if (grow(&c->body, &c->body_cap, c->body_len + n)) { c->error_status = 500; return -1; }
    memcpy(c->body + c->body_len, at, n);
    c->body_len += n;
    return 0;
}

static int serve(Conn *c);
static int on_message_complete(llhttp_t *p) { return serve(p->data); }

static const hdr_t *header(Conn *c, const char *name, size_t n, int *count) {
    const hdr_t *found = NULL;
    for (uint32_t i = 0; i < c->nh; i++)
        if (c->h[i].name_len == n && !memcmp(c->head + c->h[i].name, name, n)) {
            found = &c->h[i];
            if (count) (*count)++;
        }
    return found;
}

/* ---- output ---------------------------------------------------------------------------- */
static int schedule(Conn *c) {
    if (c->in_outbox) return 0;
    if (OUTBOX_LEN == OUTBOX_CAP) {
        size_t cap = OUTBOX_CAP ? OUTBOX_CAP * 2 : 64;
        Conn **o = realloc(OUTBOX, cap * sizeof *o);
        if (!o) { PyErr_NoMemory(); return -1; }
        OUTBOX = o;
        OUTBOX_CAP = cap;
    }
    Py_INCREF(c);
    c->in_outbox = 1;
    OUTBOX[OUTBOX_LEN++] = c;
    if (OUTBOX_LEN == 1 && CALL_SOON) {
        PyObject *h = PyObject_CallOneArg(CALL_SOON, FLUSH);
        if (!h) return -1;
        Py_DECREF(h);
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

static void tick_date(void) {
    time_t now = time(NULL);
    if (now == DATE_SECOND) return;
    DATE_SECOND = now;
    struct tm tm;
    gmtime_r(&now, &tm);
    DATE_LEN = strftime(DATE_LINE, sizeof DATE_LINE, "date: %a, %d %b %Y %H:%M:%S GMT\r\n", &tm);
}

static int token_char(uint8_t ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static int rid_char(uint8_t ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
           ch == '.' || ch == '_' || ch == ':' || ch == '-';
}

static int is_hop_or_reserved(const uint8_t *name, uint32_t n) {
    static const char *HOP[4] = {"content-length", "transfer-encoding", "connection", "keep-alive"};
    for (int i = 0; i < 4; i++)
        if (strlen(HOP[i]) == n && !memcmp(HOP[i], name, n)) return 1;
    return n >= 9 && !memcmp(name, "x-edgefn-", 9);
}

static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* The response to `c`'s request into c->out: status line, date, the guest's headers
 * (`frame` points at its pairs section, `count` of them; names lower-cased; framing
 * and x-edgefn-* dropped), the PoP's own headers, content-length, the body. Returns
 * the body's size, or -1 (MemoryError set). */
static long write_response(Conn *c, int status, const uint8_t *frame, uint32_t count,
                           const uint8_t *body, uint32_t body_len, PyObject *label,
                           const char *rid, size_t rid_len, int keep_alive, int head) {
    size_t need = 320 + (label ? (size_t)PyBytes_GET_SIZE(label) : 0) + rid_len + body_len;
    const uint8_t *q = frame;
    int dated = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t n = get_u32(q), m = get_u32(q + 4 + n);
        if (n == 4 && !memcmp(q + 4, "date", 4)) dated = 1;
        need += n + m + 4;
        q += 8 + n + m;
    }
    if (grow(&c->out, &c->out_cap, c->out_len + need)) { PyErr_NoMemory(); return -1; }
    char *o = (char *)c->out + c->out_len;
    const char *why = reason(status);
    PUTS("HTTP/1.1 ");
    o = put_u64(o, (uint64_t)status);
    *o++ = ' ';
    PUT(why, strlen(why));
    PUTS("\r\n");
    if (!dated) { tick_date(); PUT(DATE_LINE, DATE_LEN); }
    q = frame;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t n = get_u32(q), m = get_u32(q + 4 + n);
        const uint8_t *name = q + 4, *value = q + 8 + n;
        q += 8 + n + m;
        if (is_hop_or_reserved(name, n)) continue;
        for (uint32_t j = 0; j < n; j++)
            *o++ = (char)(name[j] >= 'A' && name[j] <= 'Z' ? name[j] + 32 : name[j]);
        PUTS(": ");
        PUT(value, m);
        PUTS("\r\n");
    }
    if (label) {
        PUTS("x-edgefn-function: ");
        PUT(PyBytes_AS_STRING(label), (size_t)PyBytes_GET_SIZE(label));
        PUTS("\r\nx-edgefn-cache: MISS\r\n");
    }
    PUTS("x-request-id: ");
    PUT(rid, rid_len);
    PUTS("\r\n");
    int bodyless = status == 204 || status == 304;
    if (!bodyless) {
        PUTS("content-length: ");
        o = put_u64(o, body_len);
        PUTS("\r\n");
    }
    if (!keep_alive) PUTS("connection: close\r\n");
    else if (c->p.http_minor == 0) PUTS("connection: keep-alive\r\n");
    PUTS("\r\n");
    if (!bodyless && !head) PUT(body, body_len);
    c->out_len = (size_t)((uint8_t *)o - c->out);
    if (!keep_alive) c->closing = 1;
    return bodyless ? 0 : (long)body_len;
}

/* The request id: an incoming well-formed x-request-id, else prefix-counter. */
static size_t request_id(Conn *c, char *rid, uint64_t *counter) {
    const hdr_t *h = header(c, "x-request-id", 12, NULL);
    if (h && h->value_len >= 1 && h->value_len <= 128) {
        const uint8_t *v = (const uint8_t *)c->head + h->value;
        uint32_t i = 0;
        while (i < h->value_len && rid_char(v[i])) i++;
        if (i == h->value_len && !(i == 6 && !memcmp(v, "warmup", 6))) {
            memcpy(rid, v, i);
            *counter = 0;
            return i;
        }
    }
    *counter = ++RID_COUNTER;
    memcpy(rid, RID_PREFIX, RID_PREFIX_LEN);
    rid[RID_PREFIX_LEN] = '-';
    return (size_t)(put_hex(rid + RID_PREFIX_LEN + 1, *counter) - rid);
}

/* ---- events and the access log (mode c) ------------------------------------------------ */
static void log_stamp(time_t second) {
    if (second == LOG_SECOND) return;
    LOG_SECOND = second;
    struct tm tm;
    gmtime_r(&second, &tm);
    strftime(LOG_STAMP, sizeof LOG_STAMP, "%Y-%m-%dT%H:%M:%S", &tm);
}

static int record(Conn *c, int route, int status, long sent, const char *rid, size_t rid_len,
                  uint64_t counter, const char *path, size_t path_len) {
    uint64_t dur = mono_ns() - c->started_ns;
    if (grow(&EVENTS, &EVENTS_CAP, EVENTS_LEN + sizeof(lane_event))) return -1;
    lane_event *e = (lane_event *)(EVENTS + EVENTS_LEN);
    EVENTS_LEN += sizeof(lane_event);
    e->ts = c->arrived;
    e->rid = counter;
    e->dur_ns = dur;
    e->status = (uint32_t)status;
    e->bytes_out = (uint32_t)sent;
    e->bytes_in = (uint32_t)c->body_len;
    e->route = (uint16_t)route;
    e->method = c->p.method;
    memcpy(e->client, c->client, 16);
    /* ts=2026-11-30T11:00:00.123Z method=GET path=/hello status=200 fn=hello@1a2b3c4d
       dur_ms=0.210 bytes=13 rid=9f2c41d0aa3e-1 client=127.0.0.1 */
    PyObject *label = route >= 0 ? ROUTES[route].label : NULL;
    size_t need = 160 + path_len + rid_len + c->client_text_len +
                  (label ? (size_t)PyBytes_GET_SIZE(label) : 1);
    if (grow(&LOG, &LOG_CAP, LOG_LEN + need)) return -1;
    char *o = (char *)LOG + LOG_LEN;
    time_t second = (time_t)c->arrived;
    log_stamp(second);
    PUTS("ts=");
    PUT(LOG_STAMP, 19);
    int ms = (int)((c->arrived - (double)second) * 1000);
    *o++ = '.';
    *o++ = (char)('0' + ms / 100);
    *o++ = (char)('0' + ms / 10 % 10);
    *o++ = (char)('0' + ms % 10);
    PUTS("Z method=");
    const char *m = ll_method_name(c->p.method);
    PUT(m, strlen(m));
    PUTS(" path=");
    PUT(path, path_len);
    PUTS(" status=");
    o = put_u64(o, (uint64_t)status);
    PUTS(" fn=");
    if (label) PUT(PyBytes_AS_STRING(label), (size_t)PyBytes_GET_SIZE(label));
    else *o++ = '-';
    PUTS(" dur_ms=");
    uint64_t us = (dur + 500) / 1000;
    o = put_u64(o, us / 1000);
    *o++ = '.';
    *o++ = (char)('0' + us % 1000 / 100);
    *o++ = (char)('0' + us % 100 / 10);
    *o++ = (char)('0' + us % 10);
    PUTS(" bytes=");
    o = put_u64(o, (uint64_t)sent);
    PUTS(" rid=");
    PUT(rid, rid_len);
    PUTS(" client=");
    PUT(c->client_text, c->client_text_len);
    *o++ = '\n';
    LOG_LEN = (size_t)((uint8_t *)o - LOG);
    return 0;
}

/* ---- one request ----------------------------------------------------------------------- */
/* What the front checks on every request, cheaply; 0 when the lane may serve it. A
 * request failing one goes to Python, which answers as the PoP does. */
static int plain(Conn *c, const char *path, size_t path_len) {
    if (path_len == 0 || path[0] != '/' || memchr(c->url, '#', c->url_len)) return 0;
    for (size_t i = 0; i < path_len; i++) {  /* dot segments, encoded or not, `\`, %2f */
        char ch = path[i];
        if (ch == '\\' || ch == '%' || (ch == '.' && path[i - 1] == '/')) return 0;
    }
    int hosts = 0;
    const hdr_t *host = header(c, "host", 4, &hosts);
    if (hosts != 1 || header(c, "x-edgefn-warmup", 15, NULL) || header(c, "upgrade", 7, NULL) ||
            header(c, "expect", 6, NULL) || header(c, "transfer-encoding", 17, NULL))
        return 0;
    const uint8_t *v = (const uint8_t *)c->head + host->value;
    for (uint32_t i = 0; i < host->value_len; i++)  /* host[:port], a reg-name or IPv4 */
        if (!((v[i] >= '0' && v[i] <= '9') || (v[i] >= 'a' && v[i] <= 'z') ||
              (v[i] >= 'A' && v[i] <= 'Z') || v[i] == '.' || v[i] == '-' || v[i] == ':'))
            return 0;
    return 1;
}

static int find_route(const char *path, size_t n) {
    for (int i = 0; i < N_ROUTES; i++)
        if (ROUTES[i].path_len == n && !memcmp(ROUTES[i].path, path, n)) return i;
    return -1;
}

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

/* The request in the function ABI (edgefn_core/abi.py) into REQ; its length, or 0. */
static size_t encode(Conn *c, route_t *r, const char *m, const char *path, size_t path_len,
                     const char *query, size_t query_len) {
    size_t n = 4 + 16 + strlen(m) + path_len + query_len + c->nh * 8 + c->head_len +
               4 + c->body_len + (size_t)PyBytes_GET_SIZE(r->env_blob) +
               (size_t)PyBytes_GET_SIZE(r->params_blob) +
               (size_t)PyBytes_GET_SIZE(r->principal_blob);
    if (grow(&REQ, &REQ_CAP, n)) return 0;
    uint8_t *o = REQ;
    memcpy(o, "EFQ1", 4);
    o = put_str(o + 4, m, (uint32_t)strlen(m));
    o = put_str(o, path, (uint32_t)path_len);
    o = put_str(o, query, (uint32_t)query_len);
    memcpy(o, &c->nh, 4);
    o += 4;
    for (uint32_t i = 0; i < c->nh; i++) {
        o = put_str(o, c->head + c->h[i].name, c->h[i].name_len);
        o = put_str(o, c->head + c->h[i].value, c->h[i].value_len);
    }
    o = put_blob(o, r->env_blob);
    o = put_str(o, c->body ? (const void *)c->body : "", (uint32_t)c->body_len);
    o = put_blob(put_blob(o, r->params_blob), r->principal_blob);
    return (size_t)(o - REQ);
}

/* Check the guest's response frame as abi.decode_response does; its pairs section
 * (after status and count) or NULL. */
static const uint8_t *check_frame(const uint8_t *p, uint64_t len, uint32_t *status,
                                  uint32_t *count, const uint8_t **body, uint32_t *body_len) {
    if (len < 8) return NULL;
    *status = get_u32(p);
    *count = get_u32(p + 4);
    if (*status < 200 || *status > 599 || (uint64_t)*count * 8 > len - 8) return NULL;
    uint64_t pos = 8;
    for (uint32_t i = 0; i < *count; i++) {
        if (len - pos < 4) return NULL;
        uint32_t n = get_u32(p + pos);
        if (n == 0 || n > len - pos - 4) return NULL;
        for (uint32_t j = 0; j < n; j++) if (!token_char(p[pos + 4 + j])) return NULL;
        pos += 4 + (uint64_t)n;
        if (len - pos < 4) return NULL;
        uint32_t m = get_u32(p + pos);
        if (m > len - pos - 4) return NULL;
        for (uint32_t j = 0; j < m; j++) {
            uint8_t ch = p[pos + 4 + j];
            if (ch == '\r' || ch == '\n' || ch == 0) return NULL;
        }
        pos += 4 + (uint64_t)m;
    }
    if (len - pos < 4) return NULL;
    *body_len = get_u32(p + pos);
    if (*body_len > len - pos - 4) return NULL;
    *body = p + pos + 4;
    return p + 8;
}

/* 1 when served in C; 0 to hand it to Python; -1 on a Python error. */
static int serve_native(Conn *c, int route, const char *m, const char *path, size_t path_len,
                        const char *query, size_t query_len, int keep_alive) {
    route_t *r = &ROUTES[route];
    size_t n = encode(c, r, m, path, path_len, query, query_len);
    if (!n) return 0;
    REQ_LEN = n;
    if (r->call(r->engine, r->pre, r->memory_limit, r->deadline_ticks, REQ, n, r->max_response,
                1, &RESULT, r->times) != 0) {
        r->failed++;  /* a trap or a limit: Python's containment answers it (it runs again) */
        return 0;
    }
    uint32_t status, count, body_len;
    const uint8_t *body;
    const uint8_t *pairs = check_frame(RESULT.response, RESULT.response_len, &status, &count,
                                       &body, &body_len);
    if (!pairs) return 0;
    char rid[160];
    uint64_t counter;
    size_t rid_len = request_id(c, rid, &counter);
    long sent = write_response(c, (int)status, pairs, count, body, body_len, r->label, rid,
                               rid_len, keep_alive, c->p.method == HTTP_HEAD);
    if (sent < 0) return -1;
    r->served++;
    if ((c->mode & MODE_EVENTS) &&
            record(c, route, (int)status, sent, rid, rid_len, counter, path, path_len)) {
        PyErr_NoMemory();
        return -1;
    }
    return 1;
}

/* The request as a tuple for Python: (method, path, query, headers, body, keep_alive,
 * route index or -1). */
static int hand_to_python(Conn *c, const char *m, const char *path, size_t path_len,
                          const char *query, size_t query_len, int keep_alive, int route) {
    if (!c->pending && !(c->pending = PyList_New(0))) return -1;
    PyObject *headers = PyList_New(c->nh);
    if (!headers) return -1;
    for (uint32_t i = 0; i < c->nh; i++) {
        PyObject *t = Py_BuildValue("(y#y#)", c->head + c->h[i].name, (Py_ssize_t)c->h[i].name_len,
                                    c->head + c->h[i].value, (Py_ssize_t)c->h[i].value_len);
        if (!t) { Py_DECREF(headers); return -1; }
        PyList_SET_ITEM(headers, i, t);
    }
    PyObject *req = Py_BuildValue("(yy#y#Ny#Oi)", m, path, (Py_ssize_t)path_len, query,
                                  (Py_ssize_t)query_len, headers,
                                  c->body ? (const char *)c->body : "", (Py_ssize_t)c->body_len,
                                  keep_alive ? Py_True : Py_False, route);
    if (!req) return -1;
    int rc = PyList_Append(c->pending, req);
    Py_DECREF(req);
    c->to_python = 1;
    return rc;
}

static int serve(Conn *c) {
    const char *m = ll_method_name(c->p.method);
    const char *path = c->url, *q = memchr(c->url, '?', c->url_len);
    size_t path_len = q ? (size_t)(q - c->url) : c->url_len;
    const char *query = q ? q + 1 : "";
    size_t query_len = q ? c->url_len - path_len - 1 : 0;
    int keep_alive = ll_should_keep_alive(&c->p);
    int route = find_route(path, path_len);
    if ((c->mode & MODE_C_SERVE) && !c->to_python && route >= 0 && plain(c, path, path_len)) {
        int rc = serve_native(c, route, m, path, path_len, query, query_len, keep_alive);
        if (rc) return rc < 0 ? -1 : 0;
    }
    return hand_to_python(c, m, path, path_len, query, query_len, keep_alive, route) ? -1 : 0;
}

/* ---- the Python type ------------------------------------------------------------------- */
static PyTypeObject ConnType;

static int Conn_init(Conn *c, PyObject *args, PyObject *kw) {
    int mode = 0;
    static char *KW[] = {"mode", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|i", KW, &mode)) return -1;
    if (!ll_init) { PyErr_SetString(PyExc_RuntimeError, "call setup() first"); return -1; }
    c->mode = mode;
    ll_init(&c->p, HTTP_REQUEST, &SETTINGS);
    c->p.data = c;
    return 0;
}

static void Conn_dealloc(Conn *c) {
    PyObject_GC_UnTrack(c);
    Py_CLEAR(c->write);
    Py_CLEAR(c->close);
    Py_CLEAR(c->pending);
    free(c->out);
    free(c->body);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

static int Conn_traverse(Conn *c, visitproc visit, void *arg) {
    Py_VISIT(c->write);
    Py_VISIT(c->close);
    Py_VISIT(c->pending);
    return 0;
}

static int Conn_clear(Conn *c) {
    Py_CLEAR(c->write);
    Py_CLEAR(c->close);
    Py_CLEAR(c->pending);
    return 0;
}

/* attach(transport, client_ip): where responses go. */
static PyObject *Conn_attach(Conn *c, PyObject *const *a, Py_ssize_t n) {
    if (n != 2 || !PyUnicode_Check(a[1])) {
        PyErr_SetString(PyExc_TypeError, "attach(transport, client_ip: str)");
        return NULL;
    }
    Py_XSETREF(c->write, PyObject_GetAttrString(a[0], "write"));
    Py_XSETREF(c->close, PyObject_GetAttrString(a[0], "close"));
    if (!c->write || !c->close) return NULL;
    Py_ssize_t len;
    const char *ip = PyUnicode_AsUTF8AndSize(a[1], &len);
    if (!ip) return NULL;
    if ((size_t)len >= sizeof c->client_text) len = sizeof c->client_text - 1;
    memcpy(c->client_text, ip, (size_t)len);
    c->client_text[len] = 0;
    c->client_text_len = (size_t)len;
    memset(c->client, 0, 16);
    struct in_addr v4;
    if (inet_pton(AF_INET, c->client_text, &v4) == 1) {
        c->client[10] = c->client[11] = 0xff;
        memcpy(c->client + 12, &v4, 4);
    } else {
        inet_pton(AF_INET6, c->client_text, c->client);
    }
    Py_RETURN_NONE;
}

/* detach(): the connection is gone (breaks the transport <-> protocol cycle). */
static PyObject *Conn_detach(Conn *c, PyObject *unused) {
    (void)unused;
    Py_CLEAR(c->write);
    Py_CLEAR(c->close);
    c->closing = 1;
    c->out_len = 0;
    Py_RETURN_NONE;
}

static void front_error(Conn *c, int status) {
    static const char BODY[] = "malformed HTTP request\n";
    if (grow(&c->out, &c->out_cap, c->out_len + 256)) return;
    char *o = (char *)c->out + c->out_len;
    const char *why = reason(status);
    PUTS("HTTP/1.1 ");
    o = put_u64(o, (uint64_t)status);
    *o++ = ' ';
    PUT(why, strlen(why));
    PUTS("\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: 23\r\n"
         "connection: close\r\n\r\n");
    PUT(BODY, sizeof BODY - 1);
    c->out_len = (size_t)((uint8_t *)o - c->out);
    c->closing = 1;
}

/* data_received(data) -> None, or the list of requests Python must answer (in order,
 * each with respond()). Responses wait for flush(), scheduled with loop.call_soon. */
static PyObject *Conn_data_received(Conn *c, PyObject *data) {
    if (c->closing) Py_RETURN_NONE;
    char *buf;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(data, &buf, &n)) return NULL;
    c->to_python = 0;
    int err = ll_execute(&c->p, buf, (size_t)n);
    if (PyErr_Occurred()) return NULL;
    if (err != HPE_OK) front_error(c, c->error_status ? c->error_status : 400);
    if (c->out_len && schedule(c)) return NULL;
    if (c->pending) {
        PyObject *p = c->pending;
        c->pending = NULL;
        if (Py_IS_TYPE(c, &ConnType)) return p;
        /* a subclass is the protocol itself (uvloop drops what data_received returns):
         * its `answer(requests)` gets them */
        PyObject *r = PyObject_CallMethod((PyObject *)c, "answer", "N", p);
        if (!r) return NULL;
        Py_DECREF(r);
    }
    Py_RETURN_NONE;
}

/* respond(route, status, headers, body, keep_alive, method): the answer Python produced
 * for a handed-over request, written in C as the lane writes its own. */
static PyObject *Conn_respond(Conn *c, PyObject *const *a, Py_ssize_t n) {
    if (n != 6) { PyErr_SetString(PyExc_TypeError, "respond() takes 6 arguments"); return NULL; }
    int route = (int)PyLong_AsLong(a[0]), status = (int)PyLong_AsLong(a[1]);
    if (PyErr_Occurred()) return NULL;
    if (!PyList_Check(a[2]) || !PyBytes_Check(a[3]) || !PyBytes_Check(a[5])) {
        PyErr_SetString(PyExc_TypeError, "headers: list, body and method: bytes");
        return NULL;
    }
    /* the headers as a pairs section, so write_response reads one format */
    Py_ssize_t nh = PyList_GET_SIZE(a[2]);
    size_t size = 0;
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *t = PyList_GET_ITEM(a[2], i);
        size += 8 + (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 0)) +
                (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 1));
    }
    uint8_t *frame = malloc(size + 1), *o = frame;
    if (!frame) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < nh; i++) {
        PyObject *t = PyList_GET_ITEM(a[2], i);
        PyObject *k = PyTuple_GET_ITEM(t, 0), *v = PyTuple_GET_ITEM(t, 1);
        o = put_str(o, PyBytes_AS_STRING(k), (uint32_t)PyBytes_GET_SIZE(k));
        o = put_str(o, PyBytes_AS_STRING(v), (uint32_t)PyBytes_GET_SIZE(v));
    }
    char rid[160];
    uint64_t counter;
    size_t rid_len = request_id(c, rid, &counter);
    long sent = write_response(c, status, frame, (uint32_t)nh,
                               (const uint8_t *)PyBytes_AS_STRING(a[3]),
                               (uint32_t)PyBytes_GET_SIZE(a[3]),
                               route >= 0 ? ROUTES[route].label : NULL, rid, rid_len,
                               PyObject_IsTrue(a[4]), !strcmp(PyBytes_AS_STRING(a[5]), "HEAD"));
    free(frame);
    if (sent < 0) return NULL;
    if (schedule(c)) return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef CONN_METHODS[] = {
    {"data_received", (PyCFunction)Conn_data_received, METH_O, "feed bytes read"},
    {"feed", (PyCFunction)Conn_data_received, METH_O, "same as data_received"},
    {"attach", (PyCFunction)(void (*)(void))Conn_attach, METH_FASTCALL, "attach(transport, ip)"},
    {"detach", (PyCFunction)Conn_detach, METH_NOARGS, "the connection is gone"},
    {"respond", (PyCFunction)(void (*)(void))Conn_respond, METH_FASTCALL,
     "respond(route, status, headers, body, keep_alive, method)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject ConnType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_native_lane.Conn",
    .tp_basicsize = sizeof(Conn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Conn_init,
    .tp_dealloc = (destructor)Conn_dealloc,
    .tp_traverse = (traverseproc)Conn_traverse,
    .tp_clear = (inquiry)Conn_clear,
    .tp_methods = CONN_METHODS,
};

/* ---- module functions ------------------------------------------------------------------ */
/* flush(): each waiting connection's responses in one transport.write (and its close). */
static PyObject *flush(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    size_t n = OUTBOX_LEN;
    Conn **box = OUTBOX;
    OUTBOX = NULL;
    OUTBOX_LEN = OUTBOX_CAP = 0;
    PyObject *failed = NULL;
    for (size_t i = 0; i < n; i++) {
        Conn *c = box[i];
        c->in_outbox = 0;
        if (c->out_len && c->write && !failed) {
            PyObject *data = PyBytes_FromStringAndSize((const char *)c->out,
                                                       (Py_ssize_t)c->out_len);
            c->out_len = 0;
            PyObject *r = data ? PyObject_CallOneArg(c->write, data) : NULL;
            Py_XDECREF(data);
            if (!r) failed = c->write;
            Py_XDECREF(r);
            if (r && c->closing && c->close) {
                r = PyObject_CallNoArgs(c->close);
                if (!r) failed = c->close;
                Py_XDECREF(r);
            }
        }
        c->out_len = 0;
        Py_DECREF(c);
    }
    free(box);
    if (failed) return NULL;
    Py_RETURN_NONE;
}

/* drain() -> (events, log): the records and access-log lines since the last drain. */
static PyObject *drain(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    PyObject *out = Py_BuildValue("(y#y#)", (const char *)EVENTS, (Py_ssize_t)EVENTS_LEN,
                                  (const char *)LOG, (Py_ssize_t)LOG_LEN);
    EVENTS_LEN = LOG_LEN = 0;
    return out;
}

static int dlsym_all(void *h) {
#define SYM(var, name) if (!(*(void **)&var = dlsym(h, name))) return -1
    SYM(ll_init, "llhttp_init");
    SYM(ll_settings_init, "llhttp_settings_init");
    SYM(ll_execute, "llhttp_execute");
    SYM(ll_should_keep_alive, "llhttp_should_keep_alive");
    SYM(ll_get_method, "llhttp_get_method");
    SYM(ll_get_http_major, "llhttp_get_http_major");
    SYM(ll_get_http_minor, "llhttp_get_http_minor");
    SYM(ll_method_name, "llhttp_method_name");
    return 0;
#undef SYM
}

/* setup(httptools_parser_so, call_soon, flush, rid_prefix, result_size): load llhttp's
 * API; `call_soon(flush)` runs once per loop turn that has responses waiting. */
static PyObject *setup(PyObject *mod, PyObject *const *a, Py_ssize_t n) {
    (void)mod;
    const char *so, *prefix;
    Py_ssize_t prefix_len;
    long result_size;
    if (n != 5 || !(so = PyUnicode_AsUTF8(a[0])) ||
            PyBytes_AsStringAndSize(a[3], (char **)&prefix, &prefix_len) ||
            ((result_size = PyLong_AsLong(a[4])) == -1 && PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError,
                            "setup(so, call_soon, flush, rid_prefix, result_size)");
        return NULL;
    }
    if (result_size != (long)sizeof(edgefn_result)) {
        PyErr_SetString(PyExc_RuntimeError, "edgefn_result layout differs from reactor.c's");
        return NULL;
    }
    void *h = dlopen(so, RTLD_NOW | RTLD_NOLOAD);
    if (!h) h = dlopen(so, RTLD_NOW);
    if (!h || dlsym_all(h)) {
        PyErr_Format(PyExc_RuntimeError, "llhttp from %s: %s", so, dlerror());
        return NULL;
    }
    ll_settings_init(&SETTINGS);
    SETTINGS.on_message_begin = on_message_begin;
    SETTINGS.on_url = on_url;
    SETTINGS.on_header_field = on_header_field;
    SETTINGS.on_header_value = on_header_value;
    SETTINGS.on_headers_complete = on_headers_complete;
    SETTINGS.on_body = on_body;
    SETTINGS.on_message_complete = on_message_complete;
    Py_XSETREF(CALL_SOON, a[1] == Py_None ? NULL : Py_NewRef(a[1]));
    Py_XSETREF(FLUSH, Py_NewRef(a[2]));
    if ((size_t)prefix_len >= sizeof RID_PREFIX) prefix_len = sizeof RID_PREFIX - 1;
    memcpy(RID_PREFIX, prefix, (size_t)prefix_len);
    RID_PREFIX_LEN = (size_t)prefix_len;
    Py_RETURN_NONE;
}

/* add_route(path, call_ptr, engine, pre, memory_limit, deadline_ticks, max_response,
 *           times_ptr_or_0, env_blob, params_blob, principal_blob, label) -> index */
static PyObject *add_route(PyObject *mod, PyObject *const *a, Py_ssize_t n) {
    (void)mod;
    if (n != 12 || N_ROUTES == MAX_ROUTES) {
        PyErr_SetString(PyExc_TypeError, "add_route takes 12 arguments (16 routes at most)");
        return NULL;
    }
    route_t *r = &ROUTES[N_ROUTES];
    char *path;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(a[0], &path, &len)) return NULL;
    if ((size_t)len >= sizeof r->path) { PyErr_SetString(PyExc_ValueError, "path"); return NULL; }
    memcpy(r->path, path, (size_t)len);
    r->path_len = (size_t)len;
    r->call = (reactor_call_t)PyLong_AsVoidPtr(a[1]);
    r->engine = PyLong_AsVoidPtr(a[2]);
    r->pre = PyLong_AsVoidPtr(a[3]);
    r->memory_limit = PyLong_AsLongLong(a[4]);
    r->deadline_ticks = PyLong_AsUnsignedLongLong(a[5]);
    r->max_response = PyLong_AsUnsignedLongLong(a[6]);
    r->times = PyLong_AsVoidPtr(a[7]);
    if (PyErr_Occurred()) return NULL;
    for (int i = 8; i < 12; i++)
        if (!PyBytes_Check(a[i])) {
            PyErr_SetString(PyExc_TypeError, "blobs are bytes");
            return NULL;
        }
    r->env_blob = Py_NewRef(a[8]);
    r->params_blob = Py_NewRef(a[9]);
    r->principal_blob = Py_NewRef(a[10]);
    r->label = Py_NewRef(a[11]);
    return PyLong_FromLong(N_ROUTES++);
}

/* stats() -> [(served, failed)] per route: what a metrics scrape would read. */
static PyObject *stats(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    PyObject *out = PyList_New(N_ROUTES);
    for (int i = 0; out && i < N_ROUTES; i++)
        PyList_SET_ITEM(out, i, Py_BuildValue("(KK)", (unsigned long long)ROUTES[i].served,
                                              (unsigned long long)ROUTES[i].failed));
    return out;
}

static int PROBE_KEEP_ALIVE = -1;
static int probe_complete(llhttp_t *p) { PROBE_KEEP_ALIVE = ll_should_keep_alive(p); return 0; }

/* layout_check() -> (method_field, method_accessor, major, minor, major_accessor,
 * minor_accessor, keep_alive): a known request parsed with a bare parser, so Python
 * can compare the struct fields with llhttp's own accessors. */
static PyObject *layout_check(PyObject *mod, PyObject *unused) {
    (void)mod; (void)unused;
    if (!ll_init) { PyErr_SetString(PyExc_RuntimeError, "call setup() first"); return NULL; }
    static const char REQ_[] = "PUT /x HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n";
    llhttp_settings_t s;
    llhttp_t p;
    ll_settings_init(&s);
    s.on_message_complete = probe_complete;  /* keep-alive is read there: flags reset after */
    ll_init(&p, HTTP_REQUEST, &s);
    int err = ll_execute(&p, REQ_, sizeof REQ_ - 1);
    return Py_BuildValue("(iiiiiiii)", err, p.method, ll_get_method(&p), p.http_major,
                         p.http_minor, ll_get_http_major(&p), ll_get_http_minor(&p),
                         PROBE_KEEP_ALIVE);
}

/* bench_reactor(route, n) -> (CPU ns per call, calls that failed): the PoP's reactor
 * entry alone, n times, on the last request the lane encoded (REQ) for `route`. */
static PyObject *bench_reactor(PyObject *mod, PyObject *const *a, Py_ssize_t n) {
    (void)mod;
    long route = n == 2 ? PyLong_AsLong(a[0]) : -1, count = n == 2 ? PyLong_AsLong(a[1]) : 0;
    if (route < 0 || route >= N_ROUTES || count <= 0 || !REQ_LEN) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "bench_reactor(route, n) after one request");
        return NULL;
    }
    route_t *r = &ROUTES[route];
    long failed = 0;  /* cut at the inline slice: the thread was preempted mid-call */
    uint64_t t0 = cpu_ns();
    for (long i = 0; i < count; i++)
        failed += r->call(r->engine, r->pre, r->memory_limit, r->deadline_ticks, REQ, REQ_LEN,
                          r->max_response, 1, &RESULT, r->times) != 0;
    return Py_BuildValue("(dl)", (double)(cpu_ns() - t0) / (double)count, failed);
}

/* bench_serve(conn, data, n) -> (CPU ns per request, requests handed to Python): `data`
 * (one whole request) parsed and served n times in C on `conn`, its output and the
 * event buffers emptied each time; no Python, no socket. */
static PyObject *bench_serve(PyObject *mod, PyObject *const *a, Py_ssize_t n) {
    (void)mod;
    char *buf;
    Py_ssize_t len;
    long count;
    if (n != 3 || !PyObject_TypeCheck(a[0], &ConnType) ||
            PyBytes_AsStringAndSize(a[1], &buf, &len) ||
            ((count = PyLong_AsLong(a[2])) <= 0)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "bench_serve(conn, data, n)");
        return NULL;
    }
    Conn *c = (Conn *)a[0];
    long handed = 0;
    uint64_t t0 = cpu_ns();
    for (long i = 0; i < count; i++) {
        int err = ll_execute(&c->p, buf, (size_t)len);
        if (err != HPE_OK) {
            PyErr_Format(PyExc_RuntimeError, "llhttp error %d", err);
            return NULL;
        }
        if (c->pending) {  /* a call cut at the inline slice (a preempted thread) */
            handed++;
            Py_CLEAR(c->pending);
            c->to_python = 0;
        }
        c->out_len = 0;
        EVENTS_LEN = LOG_LEN = 0;
    }
    return Py_BuildValue("(dl)", (double)(cpu_ns() - t0) / (double)count, handed);
}

static PyMethodDef METHODS[] = {
    {"bench_reactor", (PyCFunction)(void (*)(void))bench_reactor, METH_FASTCALL,
     "ns per reactor call"},
    {"bench_serve", (PyCFunction)(void (*)(void))bench_serve, METH_FASTCALL,
     "ns per request served in C"},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, "load llhttp"},
    {"add_route", (PyCFunction)(void (*)(void))add_route, METH_FASTCALL, "a served path"},
    {"flush", flush, METH_NOARGS, "write what waits"},
    {"drain", drain, METH_NOARGS, "events and access-log lines"},
    {"stats", stats, METH_NOARGS, "per-route counters"},
    {"layout_check", layout_check, METH_NOARGS, "llhttp struct vs accessors"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_native_lane",
    "PROTOTYPE native data plane (bench/_native_lane.py); not used by the PoP", -1, METHODS,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__native_lane(void) {
    if (PyType_Ready(&ConnType) < 0) return NULL;
    PyObject *m = PyModule_Create(&MODULE);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "Conn", (PyObject *)&ConnType) < 0) return NULL;
    PyModule_AddIntConstant(m, "MODE_C_SERVE", MODE_C_SERVE);
    PyModule_AddIntConstant(m, "MODE_EVENTS", MODE_EVENTS);
    PyModule_AddIntConstant(m, "EVENT_SIZE", (long)sizeof(lane_event));
    return m;
}
