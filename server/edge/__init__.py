"""The edge: where protobuf and JSON end. servicer.py (the gRPC Translator service: messages in, plain
requests to admission, events back out as messages), wire.py (the generic handlers and the size check
before parsing), gateway.py (the HTTP side's way into the same servicer, behind the same interceptors),
lifecycle.py (health, gRPC server options, reflection), http/ (the HTTP port: the native JSON API,
DeepL's and LibreTranslate's endpoints, documents, glossaries, the pages). Nothing past the edge sees a
protobuf message."""
