"""The torch-free inference core, shared by export/ (parity, quality, benchmarks) and server/.

    config.py                   ModelConfig: the model's sizes, flags and special ids (travels into the bundle)
    tokenizer.py                this repo's BPE tokenizer, text normalisation, load_tokenizer for any bundle
    text.py                     blank text (every Unicode space and invisible character), for documents and clients
    sentencepiece_tokenizer.py  imported Marian / M2M100 tokenizers (SentencePiece + vocab.json)
    tokenizer_json.py           imported NLLB tokenizer (its own tokenizer.json)
    bundle.py                   reading and checking a model bundle
    runtime.py                  ONNX Runtime sessions for a bundle (CPU / CUDA, shared thread pool)
    kv_cache.py                 the preallocated slot cache
    device_arrays.py            the cache's arrays on the host (numpy) or a CUDA device (CuPy)
    inplace_step.py             the decoder step that writes the slot cache in place
    static_decode.py            batch greedy / beam decoding over the ONNX graphs (no server)
    beam.py                     beam-search bookkeeping for one sentence

Nothing here imports torch, transformers, gRPC or protobuf: the serving image
copies this package, and export/ uses it to check what it wrote exactly as the
server will run it.
"""
