"""Python client for the nmt.v1 Translator service."""
from client.client import AsyncTranslatorClient, TranslatorClient, options

__all__ = ["AsyncTranslatorClient", "TranslatorClient", "options"]
