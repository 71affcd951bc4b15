"""Writes the .safetensors files of the reference fixtures: an 8-byte little-endian header length, a JSON header
(dtype, shape and byte range of each tensor, and string metadata), then the raw little-endian bytes."""
import json
import struct

import torch

DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.int32: "I32", torch.bool: "BOOL"}


def save_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
