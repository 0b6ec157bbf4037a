"""The model worker: a separate process that runs models (chat and completions
with continuous batching, embeddings, rerank, LoRA adapters) behind a Unix-socket
IPC protocol (`gpu_worker.protocol`), and the client the PoP uses to reach it
(`gpu_worker.client`). Never imports `runtime` or `kv`.
"""
