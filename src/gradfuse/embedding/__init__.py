"""Turning text into vectors: the encoder (encoder.py: passages, queries and sentences, by the model's ONNX copy in
float32 or by torch), its ONNX copy (onnx_encoder.py), and the names an encoder is recorded under
(encoder_names.py).

It imports ingest/ at most, never a later step.
"""
