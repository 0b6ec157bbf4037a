/*
 * The part of wasmtime's C API that edgefn's native code calls (reactor.c, wasi.c,
 * kv_get.c), declared by layout so that no wasmtime headers are needed: the
 * library is wasmtime-py's own libwasmtime. The struct layouts are checked
 * against wasmtime-py's ctypes definitions when a library loads (native.py);
 * native.py's build keys each library by this file too.
 */
#ifndef EDGEFN_WASMTIME_C_H
#define EDGEFN_WASMTIME_C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct wasm_engine_t wasm_engine_t;
typedef struct wasmtime_store wasmtime_store_t;
typedef struct wasmtime_context wasmtime_context_t;
typedef struct wasmtime_caller wasmtime_caller_t;
typedef struct wasmtime_instance_pre wasmtime_instance_pre_t;
typedef struct wasmtime_error wasmtime_error_t;
typedef struct wasm_trap_t wasm_trap_t;
typedef struct wasi_config_t wasi_config_t;

typedef struct { uint64_t store_id; size_t private_; } wasmtime_instance_t;
typedef struct { uint8_t kind; uint8_t pad_[7]; uint8_t of[24]; } wasmtime_extern_t;
typedef union { int32_t i32; int64_t i64; uint8_t v128[16]; } wasmtime_val_raw_t;
#define WASMTIME_EXTERN_FUNC 0
#define WASMTIME_EXTERN_MEMORY 3

extern wasmtime_store_t *wasmtime_store_new(wasm_engine_t *, void *, void (*)(void *));
extern wasmtime_context_t *wasmtime_store_context(wasmtime_store_t *);
extern void wasmtime_store_delete(wasmtime_store_t *);
extern void wasmtime_store_limiter(wasmtime_store_t *, int64_t, int64_t, int64_t, int64_t, int64_t);
extern void wasmtime_context_set_epoch_deadline(wasmtime_context_t *, uint64_t);
extern wasmtime_error_t *wasmtime_instance_pre_instantiate(const wasmtime_instance_pre_t *,
    wasmtime_context_t *, wasmtime_instance_t *, wasm_trap_t **);
extern bool wasmtime_instance_export_get(wasmtime_context_t *, const wasmtime_instance_t *,
    const char *, size_t, wasmtime_extern_t *);
extern wasmtime_error_t *wasmtime_func_call_unchecked(wasmtime_context_t *, const void *,
    wasmtime_val_raw_t *, size_t, wasm_trap_t **);
extern uint8_t *wasmtime_memory_data(const wasmtime_context_t *, const void *);
extern size_t wasmtime_memory_data_size(const wasmtime_context_t *, const void *);
extern void wasmtime_engine_increment_epoch(wasm_engine_t *);
extern bool wasmtime_caller_export_get(wasmtime_caller_t *, const char *, size_t,
                                       wasmtime_extern_t *);
extern wasmtime_context_t *wasmtime_caller_context(wasmtime_caller_t *);
extern wasm_trap_t *wasmtime_trap_new(const char *, size_t);
extern wasi_config_t *wasi_config_new(void);
extern void wasi_config_delete(wasi_config_t *);
extern bool wasi_config_set_argv(wasi_config_t *, size_t, const char *const *);
extern bool wasi_config_set_env(wasi_config_t *, size_t, const char *const *,
                                const char *const *);
extern wasmtime_error_t *wasmtime_context_set_wasi(wasmtime_context_t *, wasi_config_t *);
extern bool wasmtime_error_exit_status(const wasmtime_error_t *, int *);
extern void wasmtime_error_delete(wasmtime_error_t *);

#endif
