"""TFRecord reading: fl.read_tfrecord against tf.data's own reader + parser, one run.

Usage::

    .venv/bin/python bench/tfrecord.py [--records 100000] [--images 20000] [--repeat 3]

Two files of ``tf.train.Example`` records, written once by ``Dataset.write_tfrecord``:
``small`` (``--records`` records: an int64 label, a float score, a 16-float embedding, 0-19
int64 tokens and a short bytes name) and ``images`` (``--images`` records of a 64×64×3
uint8 image as one raw bytes value plus a label). Each is read into columns by

- feedline: ``fl.read_tfrecord(path, features=spec).to_arrow()`` (local engine, one task);
- tf.data: ``TFRecordDataset(path).batch(1024).map(tf.io.parse_example, AUTOTUNE)`` iterated
  to the end (plus ``tf.io.decode_raw`` for the image), tensors left in TensorFlow;
- and, for the choice of Example decoder, the Example walk of
  :mod:`feedline.io.tfrecord.decode` against ``protobuf`` (upb) with a descriptor built at
  run time, on the same records held in memory.

Rows are compared value by value between feedline and tf.data (the run fails otherwise).
Prints records/s, MB/s of file bytes and the ratio feedline / tf.data, best of ``--repeat``,
from the page cache; writes ``bench/out/tfrecord.json``.
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

import feedline as fl
from feedline.io.tfrecord.scan import parse_records


def make_small(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 20, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(rng.integers(0, 30000, offsets[-1]))
    tokens = pa.ListArray.from_arrays(pa.array(offsets), values)
    return pa.table({
        "label": rng.integers(0, 1000, n),
        "score": rng.random(n, dtype=np.float32),
        "embedding": pa.FixedShapeTensorArray.from_numpy_ndarray(rng.random((n, 16), np.float32)),
        "tokens": tokens,
        "name": pa.array([f"item-{i}".encode() for i in range(n)], pa.binary()),
    })  # fmt: skip


def make_images(n: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, 64 * 64 * 3, dtype=np.uint8).tobytes()
    return pa.table({"image": pa.array([image] * n, pa.binary()), "label": np.arange(n) % 10})


SMALL_SPEC = {
    "label": "int64",
    "score": "float32",
    "embedding": fl.tfrecord.FixedLen((16,), "float32"),
    "tokens": fl.tfrecord.VarLen("int64"),
    "name": "bytes",
}
IMAGE_SPEC = {"image": fl.tfrecord.FixedLen((64, 64, 3), "uint8"), "label": "int64"}


def tf_spec(tf, name: str) -> dict:
    if name == "small":
        return {
            "label": tf.io.FixedLenFeature([], tf.int64),
            "score": tf.io.FixedLenFeature([], tf.float32),
            "embedding": tf.io.FixedLenFeature([16], tf.float32),
            "tokens": tf.io.RaggedFeature(tf.int64),
            "name": tf.io.FixedLenFeature([], tf.string),
        }
    return {"image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64)}  # fmt: skip


def read_tf(tf, path: str, name: str, keep: bool) -> list:
    spec = tf_spec(tf, name)

    def parse(serialized):
        out = tf.io.parse_example(serialized, spec)
        if "image" in out:
            out["image"] = tf.reshape(tf.io.decode_raw(out["image"], tf.uint8), [-1, 64, 64, 3])
        return out

    data = tf.data.TFRecordDataset(path).batch(1024).map(parse, tf.data.AUTOTUNE)
    data = data.prefetch(tf.data.AUTOTUNE)
    batches = []
    for batch in data:
        if keep:
            batches.append(batch)
    return batches


def compare(tf, table: pa.Table, batches: list, name: str) -> None:
    for column in table.column_names:
        values = [b[column] for b in batches]
        if column == "tokens":
            ours = table[column].to_pylist()
            theirs = [row for b in values for row in b.to_list()]
            assert ours == theirs, column
            continue
        theirs = np.concatenate([v.numpy() for v in values])
        chunk = table[column].combine_chunks()
        ours = chunk.to_numpy_ndarray() if hasattr(chunk, "to_numpy_ndarray") else np.asarray(
            chunk.to_pylist() if pa.types.is_binary(chunk.type) else chunk.to_numpy()
        )  # fmt: skip
        np.testing.assert_array_equal(ours, theirs, err_msg=f"{name}.{column}")


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def protobuf_example_class():
    """``tf.train.Example`` as a protobuf class built at run time (no TensorFlow)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="bench_example.proto", package="bench")
    field = descriptor_pb2.FieldDescriptorProto
    repeated, optional, message = field.LABEL_REPEATED, field.LABEL_OPTIONAL, field.TYPE_MESSAGE
    for list_name, kind in (("BytesList", field.TYPE_BYTES), ("FloatList", field.TYPE_FLOAT),
                            ("Int64List", field.TYPE_INT64)):  # fmt: skip
        value = proto.message_type.add(name=list_name).field.add(
            name="value", number=1, label=repeated, type=kind
        )
        if kind != field.TYPE_BYTES:
            value.options.packed = True
    feature = proto.message_type.add(name="Feature")
    feature.oneof_decl.add(name="kind")
    for number, (name, list_name) in enumerate(
        (("bytes_list", "BytesList"), ("float_list", "FloatList"), ("int64_list", "Int64List")), 1
    ):
        feature.field.add(name=name, number=number, label=optional, type=message,
                          type_name=f".bench.{list_name}", oneof_index=0)  # fmt: skip
    features = proto.message_type.add(name="Features")
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=optional, type=field.TYPE_STRING)
    entry.field.add(name="value", number=2, label=optional, type=message,
                    type_name=".bench.Feature")  # fmt: skip
    features.field.add(name="feature", number=1, label=repeated, type=message,
                       type_name=".bench.Features.FeatureEntry")  # fmt: skip
    proto.message_type.add(name="Example").field.add(
        name="features", number=1, label=optional, type=message, type_name=".bench.Features"
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Example"))


def decoders(path: str, repeat: int) -> dict[str, float]:
    """Seconds to get every feature's values out of the records: feedline's walk + NumPy
    decode against protobuf (upb) with per-feature value lists."""
    from feedline.io.tfrecord.columns import decode_columns
    from feedline.io.tfrecord.spec import as_specs

    data = Path(path).read_bytes()
    starts, stops, pos = [], [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        starts.append(pos + 12)
        stops.append(pos + 12 + length)
        pos += 16 + length
    records = [data[s:e] for s, e in zip(starts, stops, strict=True)]
    example = protobuf_example_class()()
    first = example.FromString(records[0])
    names = list(first.features.feature.keys())
    specs = as_specs({n: fl.tfrecord.VarLen({"bytes_list": "bytes", "float_list": "float32",
                                             "int64_list": "int64"}[
        first.features.feature[n].WhichOneof("kind")]) for n in names})  # fmt: skip

    def ours() -> None:
        keys = {n.encode(): i for i, n in enumerate(names)}
        parsed = parse_records(data, starts, stops, keys)
        decode_columns(data, parsed, names, list(specs.values()))[1](np.ones(parsed.n, bool))

    def upb() -> None:
        columns: dict[str, list] = {n: [] for n in names}
        for record in records:
            example.ParseFromString(record)
            for key, feature in example.features.feature.items():
                columns[key].append(list(getattr(feature, feature.WhichOneof("kind")).value))

    return {"feedline walk + numpy": best(ours, repeat), "protobuf upb": best(upb, repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    import tensorflow as tf

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, table, spec in (("small", make_small(args.records), SMALL_SPEC),
                                  ("images", make_images(args.images), IMAGE_SPEC)):  # fmt: skip
            out = Path(tmp) / name
            fl.from_arrow(table).write_tfrecord(out, bytes_per_file=None)
            path = str(next(out.iterdir()))
            size = Path(path).stat().st_size
            ours = fl.read_tfrecord(path, features=spec).to_arrow()
            compare(tf, ours, read_tf(tf, path, name, keep=True), name)
            feedline_s = best(lambda p=path, s=spec: fl.read_tfrecord(p, features=s).to_arrow(),
                              args.repeat)  # fmt: skip
            tf_s = best(lambda p=path, n=name: read_tf(tf, p, n, keep=False), args.repeat)
            row = {"records": table.num_rows, "file_mb": size / 1e6,
                   "feedline_records_s": table.num_rows / feedline_s,
                   "tf_data_records_s": table.num_rows / tf_s,
                   "feedline_mb_s": size / 1e6 / feedline_s, "tf_data_mb_s": size / 1e6 / tf_s,
                   "ratio_feedline_over_tf": tf_s / feedline_s}  # fmt: skip
            if name == "small":
                row["decoders_s"] = decoders(path, args.repeat)
            results[name] = row
            print(name, json.dumps(row, indent=1))
    Path("bench/out").mkdir(parents=True, exist_ok=True)
    Path("bench/out/tfrecord.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
