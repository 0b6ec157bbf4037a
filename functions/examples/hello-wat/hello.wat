;; The smallest edgefn function: the reactor ABI by hand.
;;
;; The host calls edgefn_alloc(len) for room to write the request, then
;; edgefn_handle(ptr, len), which returns (response_ptr << 32) | response_len.
;; The response is pre-encoded in a data segment (see README "Guest ABI"):
;;   u32 status = 200, u32 header count = 1,
;;   "content-type" = "text/plain; charset=utf-8", body "Hello from edgefn (WASM)!\n"
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))

  (data (i32.const 16)
    "\c8\00\00\00\01\00\00\00"
    "\0c\00\00\00content-type"
    "\19\00\00\00text/plain; charset=utf-8"
    "\1a\00\00\00Hello from edgefn (WASM)!\0a")

  ;; Bump allocator: every request gets a fresh instance, so nothing is freed.
  (func (export "edgefn_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local $end i32)
    (local.set $p (global.get $heap))
    (local.set $end (i32.add (local.get $p) (local.get $n)))
    (if (i32.gt_u (local.get $end) (i32.mul (memory.size) (i32.const 65536)))
      (then
        (if (i32.eq
              (memory.grow (i32.sub (i32.shr_u (i32.add (local.get $end) (i32.const 65535))
                                               (i32.const 16))
                                    (memory.size)))
              (i32.const -1))
          (then unreachable))))
    (global.set $heap (local.get $end))
    (local.get $p))

  (func (export "edgefn_handle") (param $ptr i32) (param $len i32) (result i64)
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 83))))
