"""Python client for the nmt.v1 Translator service."""
from client.balancing import Balancing
from client.client import AsyncTranslatorClient, TranslatorClient, options

__all__ = ["AsyncTranslatorClient", "Balancing", "TranslatorClient", "options"]
