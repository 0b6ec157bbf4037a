// Counts hits per path in the KV namespace "counters" (AssemblyScript).
import { Request, Response, kvIncrement, setHandler } from "../../sdk/assemblyscript/edgefn";
export { edgefn_alloc, edgefn_handle } from "../../sdk/assemblyscript/edgefn";

function handle(req: Request): Response {
  const count = kvIncrement("counters", req.path);
  return new Response(200, "application/json", `{"count": ${count}}\n`);
}

setHandler(handle);
