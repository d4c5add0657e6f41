from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_INTERACTIVE: _ClassVar[Priority]
    PRIORITY_BACKGROUND: _ClassVar[Priority]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_CANCELLED: _ClassVar[FinishReason]
    FINISH_REASON_RUNAWAY: _ClassVar[FinishReason]

class SplitSentences(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPLIT_SENTENCES_UNSPECIFIED: _ClassVar[SplitSentences]
    SPLIT_SENTENCES_ON: _ClassVar[SplitSentences]
    SPLIT_SENTENCES_OFF: _ClassVar[SplitSentences]
    SPLIT_SENTENCES_NEWLINES: _ClassVar[SplitSentences]

class FileStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FILE_STATUS_UNSPECIFIED: _ClassVar[FileStatus]
    FILE_STATUS_QUEUED: _ClassVar[FileStatus]
    FILE_STATUS_TRANSLATING: _ClassVar[FileStatus]
    FILE_STATUS_DONE: _ClassVar[FileStatus]
PRIORITY_INTERACTIVE: Priority
PRIORITY_BACKGROUND: Priority
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_CANCELLED: FinishReason
FINISH_REASON_RUNAWAY: FinishReason
SPLIT_SENTENCES_UNSPECIFIED: SplitSentences
SPLIT_SENTENCES_ON: SplitSentences
SPLIT_SENTENCES_OFF: SplitSentences
SPLIT_SENTENCES_NEWLINES: SplitSentences
FILE_STATUS_UNSPECIFIED: FileStatus
FILE_STATUS_QUEUED: FileStatus
FILE_STATUS_TRANSLATING: FileStatus
FILE_STATUS_DONE: FileStatus

class DecodingOptions(_message.Message):
    __slots__ = ("beam_size", "length_penalty", "temperature", "top_k", "top_p", "seed", "max_output_tokens", "num_hypotheses", "repetition_penalty", "no_repeat_ngram_size", "min_output_tokens", "no_unknown_token", "target_prefix", "alternatives")
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    LENGTH_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    NO_REPEAT_NGRAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    MIN_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NO_UNKNOWN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TARGET_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    beam_size: int
    length_penalty: float
    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_output_tokens: int
    num_hypotheses: int
    repetition_penalty: float
    no_repeat_ngram_size: int
    min_output_tokens: int
    no_unknown_token: bool
    target_prefix: str
    alternatives: int
    def __init__(self, beam_size: _Optional[int] = ..., length_penalty: _Optional[float] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., num_hypotheses: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., no_repeat_ngram_size: _Optional[int] = ..., min_output_tokens: _Optional[int] = ..., no_unknown_token: _Optional[bool] = ..., target_prefix: _Optional[str] = ..., alternatives: _Optional[int] = ...) -> None: ...

class TranslateRequest(_message.Message):
    __slots__ = ("model", "texts", "options", "return_scores", "return_tokens", "source_language", "target_language", "split_sentences", "mime_type", "glossary_id", "glossary_entries", "priority")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RETURN_SCORES_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SENTENCES_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_ID_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    options: DecodingOptions
    return_scores: bool
    return_tokens: bool
    source_language: str
    target_language: str
    split_sentences: SplitSentences
    mime_type: str
    glossary_id: str
    glossary_entries: _containers.RepeatedCompositeFieldContainer[GlossaryEntry]
    priority: Priority
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., return_scores: _Optional[bool] = ..., return_tokens: _Optional[bool] = ..., source_language: _Optional[str] = ..., target_language: _Optional[str] = ..., split_sentences: _Optional[_Union[SplitSentences, str]] = ..., mime_type: _Optional[str] = ..., glossary_id: _Optional[str] = ..., glossary_entries: _Optional[_Iterable[_Union[GlossaryEntry, _Mapping]]] = ..., priority: _Optional[_Union[Priority, str]] = ...) -> None: ...

class GlossaryEntry(_message.Message):
    __slots__ = ("source", "target")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    source: str
    target: str
    def __init__(self, source: _Optional[str] = ..., target: _Optional[str] = ...) -> None: ...

class GlossaryHit(_message.Message):
    __slots__ = ("source", "target", "occurrences", "applied")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCES_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    source: str
    target: str
    occurrences: int
    applied: bool
    def __init__(self, source: _Optional[str] = ..., target: _Optional[str] = ..., occurrences: _Optional[int] = ..., applied: _Optional[bool] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_seconds", "first_token_seconds", "total_seconds")
    QUEUE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    queue_seconds: float
    first_token_seconds: float
    total_seconds: float
    def __init__(self, queue_seconds: _Optional[float] = ..., first_token_seconds: _Optional[float] = ..., total_seconds: _Optional[float] = ...) -> None: ...

class Hypothesis(_message.Message):
    __slots__ = ("text", "score", "token_ids", "tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    score: float
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, text: _Optional[str] = ..., score: _Optional[float] = ..., token_ids: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Iterable[str]] = ...) -> None: ...

class Translation(_message.Message):
    __slots__ = ("hypotheses", "finish_reason", "input_tokens", "output_tokens", "timings", "sentences", "glossary_hits")
    HYPOTHESES_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_HITS_FIELD_NUMBER: _ClassVar[int]
    hypotheses: _containers.RepeatedCompositeFieldContainer[Hypothesis]
    finish_reason: FinishReason
    input_tokens: int
    output_tokens: int
    timings: Timings
    sentences: int
    glossary_hits: _containers.RepeatedCompositeFieldContainer[GlossaryHit]
    def __init__(self, hypotheses: _Optional[_Iterable[_Union[Hypothesis, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., sentences: _Optional[int] = ..., glossary_hits: _Optional[_Iterable[_Union[GlossaryHit, _Mapping]]] = ...) -> None: ...

class TranslateResponse(_message.Message):
    __slots__ = ("model", "translations", "detected_source_language", "detection_confidence")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TRANSLATIONS_FIELD_NUMBER: _ClassVar[int]
    DETECTED_SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DETECTION_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    model: str
    translations: _containers.RepeatedCompositeFieldContainer[Translation]
    detected_source_language: str
    detection_confidence: float
    def __init__(self, model: _Optional[str] = ..., translations: _Optional[_Iterable[_Union[Translation, _Mapping]]] = ..., detected_source_language: _Optional[str] = ..., detection_confidence: _Optional[float] = ...) -> None: ...

class TranslateStreamRequest(_message.Message):
    __slots__ = ("model", "text", "options", "source_language", "target_language", "split_sentences", "mime_type", "glossary_id", "glossary_entries")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_SENTENCES_FIELD_NUMBER: _ClassVar[int]
    MIME_TYPE_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_ID_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    model: str
    text: str
    options: DecodingOptions
    source_language: str
    target_language: str
    split_sentences: SplitSentences
    mime_type: str
    glossary_id: str
    glossary_entries: _containers.RepeatedCompositeFieldContainer[GlossaryEntry]
    def __init__(self, model: _Optional[str] = ..., text: _Optional[str] = ..., options: _Optional[_Union[DecodingOptions, _Mapping]] = ..., source_language: _Optional[str] = ..., target_language: _Optional[str] = ..., split_sentences: _Optional[_Union[SplitSentences, str]] = ..., mime_type: _Optional[str] = ..., glossary_id: _Optional[str] = ..., glossary_entries: _Optional[_Iterable[_Union[GlossaryEntry, _Mapping]]] = ...) -> None: ...

class TranslateStreamResponse(_message.Message):
    __slots__ = ("delta", "token_ids", "final", "finish_reason", "input_tokens", "output_tokens", "timings", "model", "detected_source_language", "detection_confidence", "glossary_hits")
    DELTA_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DETECTED_SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    DETECTION_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_HITS_FIELD_NUMBER: _ClassVar[int]
    delta: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    final: bool
    finish_reason: FinishReason
    input_tokens: int
    output_tokens: int
    timings: Timings
    model: str
    detected_source_language: str
    detection_confidence: float
    glossary_hits: _containers.RepeatedCompositeFieldContainer[GlossaryHit]
    def __init__(self, delta: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., final: _Optional[bool] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., model: _Optional[str] = ..., detected_source_language: _Optional[str] = ..., detection_confidence: _Optional[float] = ..., glossary_hits: _Optional[_Iterable[_Union[GlossaryHit, _Mapping]]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "texts", "normalize")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    model: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    normalize: bool
    def __init__(self, model: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., normalize: _Optional[bool] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values", "tokens")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    tokens: int
    def __init__(self, values: _Optional[_Iterable[float]] = ..., tokens: _Optional[int] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("model", "dimension", "embeddings")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    model: str
    dimension: int
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    def __init__(self, model: _Optional[str] = ..., dimension: _Optional[int] = ..., embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "version", "source_language", "target_language", "is_default", "max_source_tokens", "max_output_tokens", "max_texts_per_request", "max_beam_size", "variant", "provider", "vocab_size", "embedding_dimension", "language_pairs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    MAX_SOURCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TEXTS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_DIMENSION_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_PAIRS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    source_language: str
    target_language: str
    is_default: bool
    max_source_tokens: int
    max_output_tokens: int
    max_texts_per_request: int
    max_beam_size: int
    variant: str
    provider: str
    vocab_size: int
    embedding_dimension: int
    language_pairs: _containers.RepeatedCompositeFieldContainer[LanguagePair]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., source_language: _Optional[str] = ..., target_language: _Optional[str] = ..., is_default: _Optional[bool] = ..., max_source_tokens: _Optional[int] = ..., max_output_tokens: _Optional[int] = ..., max_texts_per_request: _Optional[int] = ..., max_beam_size: _Optional[int] = ..., variant: _Optional[str] = ..., provider: _Optional[str] = ..., vocab_size: _Optional[int] = ..., embedding_dimension: _Optional[int] = ..., language_pairs: _Optional[_Iterable[_Union[LanguagePair, _Mapping]]] = ...) -> None: ...

class LanguagePair(_message.Message):
    __slots__ = ("source_language", "target_language")
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    source_language: str
    target_language: str
    def __init__(self, source_language: _Optional[str] = ..., target_language: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "default_model")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODEL_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    default_model: str
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., default_model: _Optional[str] = ...) -> None: ...

class TranslateFileRequest(_message.Message):
    __slots__ = ("filename", "content", "source_language", "target_language", "glossary_id")
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    TARGET_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    GLOSSARY_ID_FIELD_NUMBER: _ClassVar[int]
    filename: str
    content: bytes
    source_language: str
    target_language: str
    glossary_id: str
    def __init__(self, filename: _Optional[str] = ..., content: _Optional[bytes] = ..., source_language: _Optional[str] = ..., target_language: _Optional[str] = ..., glossary_id: _Optional[str] = ...) -> None: ...

class TranslateFileResponse(_message.Message):
    __slots__ = ("status", "segments_done", "segments_total", "seconds_remaining", "billed_characters", "source_language", "filename", "content")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_DONE_FIELD_NUMBER: _ClassVar[int]
    SEGMENTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_REMAINING_FIELD_NUMBER: _ClassVar[int]
    BILLED_CHARACTERS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    status: FileStatus
    segments_done: int
    segments_total: int
    seconds_remaining: int
    billed_characters: int
    source_language: str
    filename: str
    content: bytes
    def __init__(self, status: _Optional[_Union[FileStatus, str]] = ..., segments_done: _Optional[int] = ..., segments_total: _Optional[int] = ..., seconds_remaining: _Optional[int] = ..., billed_characters: _Optional[int] = ..., source_language: _Optional[str] = ..., filename: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...
