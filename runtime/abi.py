"""The function ABI, re-exported from `edgefn_core.abi`, where it is defined once
for the host and the guests (see there for the format)."""

from __future__ import annotations

from edgefn_core.abi import (
    MAGIC,
    NO_PAIRS,
    GuestRequest,
    decode_request,
    decode_response,
    encode_pairs,
    encode_params,
    encode_request,
    encode_response,
)

__all__ = ["MAGIC", "NO_PAIRS", "GuestRequest", "decode_request", "decode_response",
           "encode_pairs", "encode_params", "encode_request", "encode_response"]
