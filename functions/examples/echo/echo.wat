;; Echo: answers 200 with the request body as the response body, and the method,
;; path, query and the env var GREETING in x-echo-* headers. Tests use it to check
;; that requests cross the reactor ABI intact. See README "Guest ABI".
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 4096))

  (data (i32.const 64) "x-echo-method")
  (data (i32.const 80) "x-echo-path")
  (data (i32.const 96) "x-echo-query")
  (data (i32.const 112) "x-echo-greeting")
  (data (i32.const 128) "content-type")
  (data (i32.const 144) "application/octet-stream")
  (data (i32.const 176) "GREETING")

  (func $alloc (export "edgefn_alloc") (param $n i32) (result i32)
    (local $p i32)
    (local $end i32)
    (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
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

  (func $u32 (param $p i32) (result i32) (i32.load align=1 (local.get $p)))

  ;; Skip one length-prefixed string at $p; returns the address after it.
  (func $skip (param $p i32) (result i32)
    (i32.add (i32.add (local.get $p) (i32.const 4)) (call $u32 (local.get $p))))

  ;; Write a length-prefixed string at $dst; returns the address after it.
  (func $put (param $dst i32) (param $src i32) (param $len i32) (result i32)
    (i32.store align=1 (local.get $dst) (local.get $len))
    (memory.copy (i32.add (local.get $dst) (i32.const 4)) (local.get $src) (local.get $len))
    (i32.add (i32.add (local.get $dst) (i32.const 4)) (local.get $len)))

  ;; Equal bytes?
  (func $eq (param $a i32) (param $b i32) (param $n i32) (result i32)
    (block $no
      (loop $next
        (if (i32.eqz (local.get $n)) (then (return (i32.const 1))))
        (br_if $no (i32.ne (i32.load8_u (local.get $a)) (i32.load8_u (local.get $b))))
        (local.set $a (i32.add (local.get $a) (i32.const 1)))
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))
    (i32.const 0))

  (func (export "edgefn_handle") (param $p i32) (param $n i32) (result i64)
    (local $q i32) (local $method i32) (local $path i32) (local $query i32)
    (local $count i32) (local $greet i32) (local $body i32)
    (local $out i32) (local $o i32)
    (local.set $greet (i32.const 0))
    (local.set $method (i32.add (local.get $p) (i32.const 4)))   ;; skip the magic
    (local.set $path (call $skip (local.get $method)))
    (local.set $query (call $skip (local.get $path)))
    (local.set $q (call $skip (local.get $query)))
    ;; headers: skip 2 * count strings
    (local.set $count (i32.mul (call $u32 (local.get $q)) (i32.const 2)))
    (local.set $q (i32.add (local.get $q) (i32.const 4)))
    (block $done
      (loop $each
        (br_if $done (i32.eqz (local.get $count)))
        (local.set $q (call $skip (local.get $q)))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $each)))
    ;; env: find GREETING
    (local.set $count (call $u32 (local.get $q)))
    (local.set $q (i32.add (local.get $q) (i32.const 4)))
    (block $done
      (loop $each
        (br_if $done (i32.eqz (local.get $count)))
        (if (i32.and (i32.eq (call $u32 (local.get $q)) (i32.const 8))
                     (call $eq (i32.add (local.get $q) (i32.const 4)) (i32.const 176) (i32.const 8)))
          (then (local.set $greet (call $skip (local.get $q)))))
        (local.set $q (call $skip (call $skip (local.get $q))))
        (local.set $count (i32.sub (local.get $count) (i32.const 1)))
        (br $each)))
    (local.set $body (local.get $q))
    ;; room for the response: the request's size plus the fixed strings is plenty
    (local.set $out (call $alloc (i32.add (local.get $n) (i32.const 256))))
    (i32.store align=1 (local.get $out) (i32.const 200))
    (i32.store align=1 (i32.add (local.get $out) (i32.const 4))
      (select (i32.const 5) (i32.const 4) (local.get $greet)))
    (local.set $o (i32.add (local.get $out) (i32.const 8)))
    (local.set $o (call $put (local.get $o) (i32.const 64) (i32.const 13)))
    (local.set $o (call $put (local.get $o) (i32.add (local.get $method) (i32.const 4))
                             (call $u32 (local.get $method))))
    (local.set $o (call $put (local.get $o) (i32.const 80) (i32.const 11)))
    (local.set $o (call $put (local.get $o) (i32.add (local.get $path) (i32.const 4))
                             (call $u32 (local.get $path))))
    (local.set $o (call $put (local.get $o) (i32.const 96) (i32.const 12)))
    (local.set $o (call $put (local.get $o) (i32.add (local.get $query) (i32.const 4))
                             (call $u32 (local.get $query))))
    (local.set $o (call $put (local.get $o) (i32.const 128) (i32.const 12)))
    (local.set $o (call $put (local.get $o) (i32.const 144) (i32.const 24)))
    (if (local.get $greet)
      (then
        (local.set $o (call $put (local.get $o) (i32.const 112) (i32.const 15)))
        (local.set $o (call $put (local.get $o) (i32.add (local.get $greet) (i32.const 4))
                                 (call $u32 (local.get $greet))))))
    (local.set $o (call $put (local.get $o) (i32.add (local.get $body) (i32.const 4))
                             (call $u32 (local.get $body))))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
            (i64.extend_i32_u (i32.sub (local.get $o) (local.get $out))))))
