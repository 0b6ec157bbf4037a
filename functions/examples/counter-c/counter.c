/* Counts hits per path in the KV namespace "counters" (atomic increment). */
#include "edgefn.h"  /* functions/sdk/c: build.sh finds it */

int64_t handle(const edgefn_request *req) {
    static const char ns[] = "counters";
    int64_t n = edgefn_kv_increment(ns, sizeof ns - 1, req->path.ptr, (int32_t)req->path.len, 1);
    char body[64] = "{\"count\": ";
    uint32_t len = 10;
    len += edgefn_itoa(n, body + len);
    body[len++] = '}';
    body[len++] = '\n';
    return edgefn_respond(200, "application/json", body, len);
}
