"""Per-layer KV specification: what each layer of a model keeps per token (full attention, a
sliding window, an MLA latent), the groups of layers a hybrid allocator pools separately, the
`ModelSpec` built on them, and a reader sizing any local Hugging Face config.json."""
