"""What every other package of edgefn shares: the one exception tree (`errors`),
the function ABI's codec (`abi`) and length-prefixed framing (`frames`).

A leaf: stdlib-only (and the C codec it builds itself, `fastcodec`) and imports
nothing of edgefn's, so `runtime`, `kv`, `gpu_worker` and the code running inside
isolates can all import it.
"""
