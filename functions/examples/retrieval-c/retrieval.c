/* Retrieval in C: POST a JSON vector; the function asks the vector binding for the
 * nearest ids in index "docs", then fetches each document's text from KV "docs". */
#include "edgefn.h"  /* functions/sdk/c: build.sh finds it */

static char out[8192];
static uint32_t pos;

static void emit(const char *s, uint32_t n) {
    for (uint32_t i = 0; i < n && pos < sizeof out; i++) out[pos++] = s[i];
}

/* Next `"id": "..."` in a JSON text from `at`; returns 0 when there is none. */
static int next_id(edgefn_str json, uint32_t *at, edgefn_str *id) {
    static const char pat[] = "\"id\": \"";
    for (uint32_t i = *at; i + sizeof pat - 1 < json.len; i++) {
        uint32_t j = 0;
        while (j < sizeof pat - 1 && json.ptr[i + j] == pat[j]) j++;
        if (j == sizeof pat - 1) {
            uint32_t s = i + j, e = s;
            while (e < json.len && json.ptr[e] != '"') e++;
            id->ptr = json.ptr + s; id->len = e - s; *at = e;
            return 1;
        }
    }
    return 0;
}

int64_t handle(const edgefn_request *req) {
    static const char name[] = "vectors.query", ns[] = "docs";
    pos = 0;
    emit("{\"index\": \"docs\", \"k\": 3, \"vector\": ", 35);
    emit(req->body.ptr, req->body.len);
    emit("}", 1);
    edgefn_str hits = edgefn_call_str(name, sizeof name - 1, out, (int32_t)pos);
    pos = 0;
    emit("{\"results\": [", 13);
    uint32_t at = 0;
    edgefn_str id;
    for (int n = 0; next_id(hits, &at, &id); n++) {
        edgefn_str text = edgefn_kv_get_str(ns, sizeof ns - 1, id.ptr, (int32_t)id.len);
        if (n) emit(", ", 2);
        emit("{\"id\": \"", 8); emit(id.ptr, id.len);
        emit("\", \"text\": \"", 12); emit(text.ptr, text.len); emit("\"}", 2);
    }
    emit("]}\n", 3);
    return edgefn_respond(200, "application/json", out, pos);
}
