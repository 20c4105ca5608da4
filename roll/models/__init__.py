"""Model and tokenizer loading (HF folder, hub id, GGUF file, file inside a package), value head."""
