/*
 * The native lane's WASI commands (part of lane.c, included by it: one translation unit,
 * so its helpers are lane.c's; `runtime.net.lane` hashes this file into the build's key):
 * a command's CGI variables for a request, its run, its output parsed into the response
 * frame the lane writes.
 */
/* ---- WASI commands run here (`commands`, a route's `cgi`) ------------------------------- */
static uint8_t *put_cstr(uint8_t *o, const char *s, size_t n) {  /* s and its NUL */
    memcpy(o, s, n);
    o[n] = 0;
    return o + n + 1;
}

/* Whether wasi.environ's `_text` (`decode("utf-8", "replace")`, then encoded again)
 * keeps `s` as it is and it fits a C string: well-formed UTF-8 (Unicode's table 3-7,
 * as Python's decoder takes it: no overlong form, no surrogate, nothing past U+10FFFF)
 * without NUL. Header names are tokens (ASCII), so `.upper()` is the C's. */
static int plain_text(const char *s, size_t n) {
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        uint8_t c = u[i];
        if (c == 0) return 0;
        if (c < 0x80) { i++; continue; }
        size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                     : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len || len > n - i) return 0;
        uint8_t lo = 0x80, hi = 0xbf;  /* the second byte's range */
        if (c == 0xe0) lo = 0xa0;
        else if (c == 0xed) hi = 0x9f;
        else if (c == 0xf0) lo = 0x90;
        else if (c == 0xf4) hi = 0x8f;
        if (u[i + 1] < lo || u[i + 1] > hi) return 0;
        for (size_t j = 2; j < len; j++)
            if (u[i + j] < 0x80 || u[i + j] > 0xbf) return 0;
        i += len;
    }
    return 1;
}

/* The command's arguments and environment for the request in l->q, as wasi.environ
 * makes them for it (the caller dispatch gives the bot class `cls`), into l->cgi in
 * the run's form (wasi.c `edgefn_wasi_run`'s `strings`): its length, and the pairs in
 * `*envc`; 0 when it is not plain (not UTF-8, a NUL: Python's). -1 no memory. */
static long cgi_strings(Lane *l, const route_t *r, int method, const char *path,
                        size_t path_len, const char *query, size_t query_len,
                        PyObject *client, long cls, size_t *envc) {
    const req_t *q = &l->q;
    Py_ssize_t client_len;
    const char *addr = PyUnicode_AsUTF8AndSize(client, &client_len);
    if (!addr) return -1;
    const char *colon = NULL;  /* client.rsplit(":", 1)[0] */
    for (Py_ssize_t i = client_len; i > 0; i--)
        if (addr[i - 1] == ':') { colon = addr + i - 1; break; }
    size_t addr_len = colon ? (size_t)(colon - addr) : (size_t)client_len;
    if (!plain_text(path, path_len) || !plain_text(query, query_len) ||
            memchr(addr, 0, addr_len))
        return 0;
    PyObject *tail = PyTuple_GET_ITEM(l->principals, cls);
    size_t need = (size_t)PyBytes_GET_SIZE(r->cgi) + (size_t)PyBytes_GET_SIZE(r->cgi_route) +
                  path_len + query_len + addr_len + (size_t)PyBytes_GET_SIZE(tail) + 160 +
                  q->head_len + (size_t)q->nh * 8 +
                  r->path_len + path_len + 32 * ((size_t)q->ncaps + 1);  /* the params */
    if (grow(&l->cgi, &l->cgi_cap, need)) return -1;
    uint8_t *o = l->cgi;
    memcpy(o, PyBytes_AS_STRING(r->cgi), (size_t)PyBytes_GET_SIZE(r->cgi));
    o += PyBytes_GET_SIZE(r->cgi);
    o = put_cstr(o, "REQUEST_METHOD", 14);
    o = put_cstr(o, METHOD_NAMES[method], strlen(METHOD_NAMES[method]));
    o = put_cstr(o, "PATH_INFO", 9);
    o = put_cstr(o, path, path_len);
    o = put_cstr(o, "QUERY_STRING", 12);
    o = put_cstr(o, query, query_len);
    o = put_cstr(o, "SERVER_PROTOCOL", 15);
    o = put_cstr(o, q->http10 ? "HTTP/1.0" : "HTTP/1.1", 8);
    o = put_cstr(o, "CONTENT_LENGTH", 14);
    char digits[24];  /* str(len(request.body)) */
    o = put_cstr(o, digits, (size_t)(put_u64(digits, q->body_len) - digits));
    const hdr_t *type = NULL;  /* the first Content-Type, as `Request.header` reads it */
    for (uint32_t i = 0; i < q->nh && !type; i++)
        if (name_is(q, &q->h[i], "content-type", 12)) type = &q->h[i];
    o = put_cstr(o, "CONTENT_TYPE", 12);
    if (type && !plain_text(q->head + type->value, type->value_len)) return 0;
    o = put_cstr(o, type ? q->head + type->value : "", type ? type->value_len : 0);
    o = put_cstr(o, "X_MATCHED_ROUTE", 15);
    o = put_cstr(o, PyBytes_AS_STRING(r->cgi_route), (size_t)PyBytes_GET_SIZE(r->cgi_route));
    o = put_cstr(o, "REMOTE_ADDR", 11);
    o = put_cstr(o, addr, addr_len);
    size_t n = r->cgi_envc + 8;
    for (uint32_t i = 0; i < q->nh; i++) {  /* HTTP_<NAME> but those `_SKIP` names */
        const hdr_t *h = &q->h[i];
        if (name_is(q, h, "content-type", 12) || name_is(q, h, "content-length", 14) ||
                name_is(q, h, "authorization", 13))
            continue;
        const char *name = q->head + h->name;
        if (!plain_text(name, h->name_len) || !plain_text(q->head + h->value, h->value_len))
            return 0;
        memcpy(o, "HTTP_", 5);
        o += 5;
        for (uint32_t j = 0; j < h->name_len; j++) {  /* .upper().replace("-", "_") */
            char ch = name[j];
            *o++ = (uint8_t)(ch == '-' ? '_' : ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
        }
        *o++ = 0;
        o = put_cstr(o, q->head + h->value, h->value_len);
        n++;
    }
    /* what the route captured: EDGEFN_PARAM_<NAME> each (`param_variable`: the name
     * upper-cased, ASCII), then a final `*`'s EDGEFN_WILDCARD, as raw as PATH_INFO */
    for (uint32_t i = 0, k = 0; i < r->nseg && k < q->ncaps; i++) {
        if (!r->seg[i].capture) continue;
        const char *value = path + q->caps[k].at;
        uint32_t value_len = q->caps[k++].len;
        if (!plain_text(value, value_len)) return 0;
        memcpy(o, "EDGEFN_PARAM_", 13);
        o += 13;
        const char *name = r->path + r->seg[i].at + 1;
        for (uint32_t j = 0; j + 1 < r->seg[i].len; j++)
            *o++ = (uint8_t)(name[j] >= 'a' && name[j] <= 'z' ? name[j] - 32 : name[j]);
        *o++ = 0;
        o = put_cstr(o, value, value_len);
        n++;
    }
    if (r->wildcard) {
        if (!plain_text(path + q->rest_at, q->rest_len)) return 0;
        o = put_cstr(o, "EDGEFN_WILDCARD", 15);
        o = put_cstr(o, path + q->rest_at, q->rest_len);
        n++;
    }
    memcpy(o, PyBytes_AS_STRING(tail), (size_t)PyBytes_GET_SIZE(tail));
    o += PyBytes_GET_SIZE(tail);
    *envc = n + 1;
    return (long)(o - l->cgi);
}

/* Python's bytes.strip() set */
static int py_space(uint8_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == 0x0b || c == 0x0c;
}

/* wasi.parse_response of a command's output, as a response frame (decode_response's
 * form) into *buf: its length, 0 when parse_response would raise (Python runs the
 * request again and says what is wrong), -1 no memory. */
static long cgi_frame(uint8_t **buf, size_t *cap, const uint8_t *out, size_t len) {
    size_t end = 0, body = 0, i;  /* the first blank line: rb"\r?\n\r?\n", leftmost */
    for (i = 0; i < len; i++) {
        size_t j;
        if (out[i] == '\r' && i + 1 < len && out[i + 1] == '\n') j = i + 2;
        else if (out[i] == '\n') j = i + 1;
        else continue;
        if (j + 1 < len && out[j] == '\r' && out[j + 1] == '\n') { body = j + 2; break; }
        if (j < len && out[j] == '\n') { body = j + 1; break; }
    }
    if (i == len) return 0;
    end = i;
    if (end > 2 * MAX_HEAD_BYTES) return 0;  /* wasi.MAX_CGI_HEAD */
    if (grow(buf, cap, 512)) return -1;
    size_t at = 8, size = 0;  /* where the next pair goes; names' and values' bytes */
    uint32_t status = 0, count = 0, lines = 0;
    int location = 0;
    size_t line = 0;
    while (line <= end) {  /* head.replace(b"\r\n", b"\n").split(b"\n") */
        if (++lines > MAX_HEAD_FIELDS) return 0;
        size_t stop = line;
        while (stop < end && out[stop] != '\n' && !(out[stop] == '\r' && stop + 1 < end &&
                                                     out[stop + 1] == '\n'))
            stop++;
        size_t next = stop == end ? end + 1 : out[stop] == '\n' ? stop + 1 : stop + 2;
        const uint8_t *colon = memchr(out + line, ':', stop - line);
        if (!colon) return 0;
        size_t a = line, b = (size_t)(colon - out), c = b + 1, d = stop;
        while (a < b && py_space(out[a])) a++;
        while (b > a && py_space(out[b - 1])) b--;
        while (c < d && py_space(out[c])) c++;
        while (d > c && py_space(out[d - 1])) d--;
        if (a == b) return 0;
        for (size_t k = a; k < b; k++) if (!TCHAR[out[k]]) return 0;
        for (size_t k = c; k < d; k++)  /* abi.CTL */
            if ((out[k] < 0x20 && out[k] != '\t') || out[k] == 0x7f) return 0;
        uint32_t n = (uint32_t)(b - a), m = (uint32_t)(d - c);
        size += (size_t)n + m;
        if (size > MAX_HEAD_BYTES) return 0;  /* check_head_size: so the frame stays small */
        char lower[8];
        if (n == 6 || n == 8)
            for (uint32_t k = 0; k < n; k++)
                lower[k] = (char)(out[a + k] >= 'A' && out[a + k] <= 'Z' ? out[a + k] + 32
                                                                      : out[a + k]);
        if (n == 6 && !memcmp(lower, "status", 6)) {  /* value.split(b" ", 1)[0], 200..599 */
            size_t k = c;
            uint32_t v = 0;
            while (k < d && out[k] != ' ') {
                if (out[k] < '0' || out[k] > '9') return 0;
                v = v * 10 + (uint32_t)(out[k] - '0');
                if (v > 599) return 0;
                k++;
            }
            if (k == c || v < 200) return 0;
            status = v;
        } else {
            if (n == 8 && !memcmp(lower, "location", 8)) location = 1;
            if (grow(buf, cap, at + 8 + n + m)) return -1;
            uint8_t *o = *buf + at;
            memcpy(o, &n, 4);
            for (uint32_t k = 0; k < n; k++)
                o[4 + k] = (uint8_t)(out[a + k] >= 'A' && out[a + k] <= 'Z' ? out[a + k] + 32
                                                                          : out[a + k]);
            o += 4 + n;
            memcpy(o, &m, 4);
            memcpy(o + 4, out + c, m);
            at += 8 + (size_t)n + m;
            count++;
        }
        line = next;
    }
    if (!status) status = location ? 302 : 200;
    uint32_t body_len = (uint32_t)(len - body);
    if ((size_t)body_len != len - body || grow(buf, cap, at + 4 + body_len))
        return (size_t)body_len != len - body ? 0 : -1;
    memcpy(*buf, &status, 4);
    memcpy(*buf + 4, &count, 4);
    memcpy(*buf + at, &body_len, 4);
    memcpy(*buf + at + 4, out + body, body_len);
    return (long)(at + 4 + body_len);
}

/* A WASI command's request run here, as WasmFunction.handle runs it inline on the
 * native path: 1 served, 0 for Python's call (`submit`: what is not plain, a run that
 * failed, wrote to stderr or answered what parse_response refuses: run again there,
 * the lane's run counting as its first inline try), -1 a Python error. */
static int command_call(Lane *l, route_t *r, int ri, int method, const hdr_t *host,
                        const char *url, size_t path_len, const char *query,
                        size_t query_len, PyObject *date, PyObject *extra, PyObject *events,
                        PyObject *client) {
    start_t s;
    int go = inline_start(l, r, &s);
    if (go <= 0) return go;
    size_t envc = 0;
    long n = cgi_strings(l, r, method, url, path_len, query, query_len, client, s.cls, &envc);
    if (n <= 0) {
        if (n < 0 && !PyErr_Occurred()) PyErr_NoMemory();
        return n < 0 ? -1 : 0;
    }
    wasi_result res;
    int32_t stage;
    Py_BEGIN_ALLOW_THREADS
    l->guest_begin();
    stage = l->wasi_run(r->engine, r->pre, r->memory_limit, r->deadline_ticks,
                        (const char *)l->cgi, (size_t)n, 1, envc,
                        (const uint8_t *)(l->q.body ? l->q.body : ""), (size_t)l->q.body_len,
                        r->max_response, &res);
    l->guest_end();
    Py_END_ALLOW_THREADS
    if (res.trap || res.error) {  /* a trap, a limit, the slice, an exit: Python's */
        if (res.trap) l->trap_delete(res.trap);
        if (res.error) l->error_delete(res.error);
        return PyObject_SetAttr(r->executor, l->lane_cut_name, Py_True) < 0 ? -1 : 0;
    }
    if (stage != WASI_RUN_OK || res.overflow || res.err_len || res.err_dropped)
        return 0;  /* Python's run logs its stderr, says what failed */
    long f = cgi_frame(&l->cgi, &l->cgi_cap, res.out, res.out_len);
    if (f <= 0) {
        if (f < 0) PyErr_NoMemory();
        return f < 0 ? -1 : 0;
    }
    int done = answer_frame(l, r, ri, method, l->cgi, (uint64_t)f, s.started, s.ts, s.verdict,
                            host, query, query_len, date, extra, events, client);
    l->commands_run += done == 1;
    return done;
}
