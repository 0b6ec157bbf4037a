/* Calls the PoP's model worker from WASM. POST a JSON body of arguments for the
 * binding named by the x-ai-op header (default "ai.chat"), e.g.
 *   {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}],
 *    "max_tokens": 32}
 * and get the binding's JSON result back. Only ai.* operations are allowed. */
#include "edgefn.h"  /* functions/sdk/c: build.sh finds it */

int64_t handle(const edgefn_request *req) {
    static const char chat[] = "ai.chat";
    edgefn_str op = edgefn_header(req, "x-ai-op");
    if (!op.len) op = (edgefn_str){chat, sizeof chat - 1};
    if (op.len < 3 || op.ptr[0] != 'a' || op.ptr[1] != 'i' || op.ptr[2] != '.') {
        static const char msg[] = "{\"error\": \"x-ai-op must name an ai.* operation\"}\n";
        return edgefn_respond(400, "application/json", msg, sizeof msg - 1);
    }
    edgefn_str out = edgefn_call_str(op.ptr, (int32_t)op.len, req->body.ptr,
                                     (int32_t)req->body.len);
    return edgefn_respond(200, "application/json", out.ptr, out.len);
}
