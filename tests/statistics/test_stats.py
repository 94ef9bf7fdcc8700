"""fl.stats and drift: reference values (numpy/scipy/pandas), merge laws, CLI, manifest."""

from __future__ import annotations

import io
import json
import math
import random
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import feedline as fl
from feedline.cli.main import main
from feedline.errors import ConfigurationError
from feedline.statistics.accumulators import QUANTILES
from feedline.statistics.compute import stats
from feedline.statistics.drift import compare, ks_pvalue
from feedline.statistics.profiler import Profiler
from feedline.statistics.quantile_sketch import DEFAULT_K, EXACT_LIMIT
from feedline.statistics.result import Stats

scipy_stats = pytest.importorskip("scipy.stats")


def close(a: Any, b: Any, rel: float = 1e-9, path: str = "") -> None:
    """Recursive equality with a relative tolerance on floats."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            close(a[k], b[k], rel, f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, rel, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=rel), (path, a, b)
    else:
        assert a == b, (path, a, b)


@pytest.fixture(scope="module")
def table() -> pa.Table:
    rng = np.random.default_rng(7)
    n = 3000
    x = rng.gamma(2.0, 3.0, n)  # skewed, so skewness and kurtosis are far from 0
    y = 0.5 * x + rng.normal(0, 2, n)
    k = rng.integers(-50, 50, n)
    c = rng.choice(["red", "green", "blue", "cyan"], n, p=[0.5, 0.3, 0.15, 0.05])
    return pa.table({"x": x, "y": y, "k": k, "c": c, "b": rng.random(n) < 0.3})


def test_numeric_columns_match_numpy_and_scipy(table: pa.Table) -> None:
    result = stats(fl.from_arrow(table), engine=fl.LocalEngine(parallelism=3))
    for name in ("x", "y", "k"):
        v, s = table[name].to_numpy().astype(float), result[name]
        assert s["count"] == len(v) and s["nulls"] == 0
        assert s["mean"] == pytest.approx(v.mean(), rel=1e-12)
        assert s["std"] == pytest.approx(v.std(ddof=1), rel=1e-12)  # sample std, ddof=1
        assert s["min"] == v.min() and s["max"] == v.max()
        assert s["skewness"] == pytest.approx(scipy_stats.skew(v, bias=True), rel=1e-9)
        assert s["kurtosis"] == pytest.approx(scipy_stats.kurtosis(v, bias=True), rel=1e-9)
        assert s["quantiles_exact"] and s["rank_error"] == 0
        expected = np.quantile(v, list(QUANTILES.values()))
        assert list(s["quantiles"].values()) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert isinstance(result["k"]["min"], int)
    json.dumps(result.to_dict(), allow_nan=False)


def test_pearson_and_spearman_match_numpy_and_scipy(table: pa.Table) -> None:
    result = stats(fl.from_arrow(table))
    cols = ["x", "y", "k"]
    assert result.correlation["columns"] == cols
    data = np.column_stack([table[c].to_numpy().astype(float) for c in cols])
    np.testing.assert_allclose(result.correlation["pearson"], np.corrcoef(data.T), atol=1e-12)
    rho = scipy_stats.spearmanr(data).statistic  # k has many ties: average ranks
    np.testing.assert_allclose(result.correlation["spearman"], rho, atol=1e-12)


def test_pearson_with_nulls_is_pairwise_like_pandas() -> None:
    rng = np.random.default_rng(1)
    df = pd.DataFrame(rng.normal(size=(500, 3)), columns=list("abc"))
    df.loc[rng.random(500) < 0.2, "a"] = np.nan
    df.loc[rng.random(500) < 0.1, "c"] = np.nan
    result = stats(fl.from_pandas(df))
    np.testing.assert_allclose(result.correlation["pearson"], df.corr().to_numpy(), atol=1e-12)
    assert result["a"]["nulls"] == df["a"].isna().sum()


def test_beyond_the_sketch_quantiles_and_spearman_stay_within_the_bound() -> None:
    rng = np.random.default_rng(2)
    n = 200_000
    x = rng.normal(size=n)
    y = x + rng.normal(size=n)
    result = stats(fl.from_arrow(pa.table({"x": x, "y": y})))
    s = result["x"]
    assert not s["quantiles_exact"]
    assert 0 < s["rank_error"] <= 1 / EXACT_LIMIT + math.ceil(math.log2(n / DEFAULT_K)) / DEFAULT_K
    ordered = np.sort(x)
    for p, q in zip(QUANTILES.values(), s["quantiles"].values(), strict=True):
        rank = np.searchsorted(ordered, q, "right") / n
        assert abs(rank - p) <= s["rank_error"] + 2 / n, (p, rank)
    rho = scipy_stats.spearmanr(x, y).statistic
    assert result.correlation["spearman"][0][1] == pytest.approx(rho, abs=1e-3)


def test_top_values_and_distinct_match_pandas(table: pa.Table) -> None:
    masked = table.set_column(3, "c", pa.array(table["c"].to_pylist()[:-100] + [None] * 100))
    result = stats(fl.from_arrow(masked), top_k=3)
    series = masked["c"].to_pandas()
    counts = series.value_counts()
    s = result["c"]
    assert s["top"] == [[k, int(v)] for k, v in counts.head(3).items()]
    assert s["distinct"] == series.nunique() and s["distinct_exact"] and s["top_error"] == 0
    assert s["nulls"] == 100 and s["count"] == len(series) - 100
    flags = masked["b"].to_pandas().value_counts()
    assert result["b"]["top"] == [[bool(k), int(v)] for k, v in flags.items()]


def test_high_cardinality_switches_to_hyperloglog_and_bounded_top_counts() -> None:
    rng = np.random.default_rng(3)
    values = [f"id-{i}" for i in rng.integers(0, 40_000, 120_000)] + ["hot"] * 5000
    s = stats(fl.from_arrow(pa.table({"v": values})))["v"]
    truth = len(set(values))
    assert not s["distinct_exact"]
    assert abs(s["distinct"] - truth) / truth < 0.06  # HLL p=12: 1.6% standard error
    assert s["top"][0][0] == "hot"
    assert 5000 - s["top_error"] <= s["top"][0][1] <= 5000


def test_nulls_nan_and_all_null_columns() -> None:
    t = pa.table(
        {
            "f": pa.array([1.0, None, float("nan"), 4.0], pa.float64()),
            "none": pa.array([None] * 4, pa.int64()),
            "s": pa.array([None] * 4, pa.string()),
        }
    )
    result = stats(fl.from_arrow(t))
    assert result["f"]["nulls"] == 2 and result["f"]["count"] == 2  # NaN counts as null
    assert result["f"]["mean"] == 2.5 and result["f"]["quantiles"]["p50"] == 2.5
    assert result["none"]["count"] == 0 and result["none"]["mean"] is None
    assert result["none"]["quantiles"]["p50"] is None and result["none"]["cdf"] == []
    assert result["s"]["distinct"] == 0 and result["s"]["top"] == []
    assert result.correlation["pearson"] == [[1.0, None], [None, None]]
    json.dumps(result.to_dict(), allow_nan=False)


def test_infinities_are_counted_and_left_out() -> None:
    t = pa.table({"f": [1.0, math.inf, -math.inf, 2.0, None], "g": [1.0, 2.0, 3.0, 4.0, 5.0]})
    result = stats(fl.from_arrow(t))
    f = result["f"]
    assert (f["count"], f["infinite"], f["nulls"]) == (2, 2, 1)
    assert (f["mean"], f["min"], f["max"], f["quantiles"]["p50"]) == (1.5, 1.0, 2.0, 1.5)
    assert result.correlation["pearson"][0][1] == pytest.approx(1.0)  # rows 0 and 3 only


def test_empty_dataset_gives_zero_counts_and_no_values() -> None:
    ds = fl.from_arrow(pa.table({"x": pa.array([], pa.float64()), "c": pa.array([], pa.string())}))
    result = stats(ds)
    assert result.rows == 0
    expected = {
        "count": 0,
        "nulls": 0,
        "mean": None,
        "std": None,
        "min": None,
        "max": None,
        "skewness": None,
        "kurtosis": None,
        "cdf": [],
    }
    assert {k: result["x"][k] for k in expected} == expected
    assert set(result["x"]["quantiles"].values()) == {None}
    assert result["c"]["distinct"] == 0 and result["c"]["top"] == []
    json.dumps(result.to_dict(), allow_nan=False)
    with pytest.raises(ConfigurationError, match="no rows"):
        compare(ds, ds)


rows = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(-1000, 1000).map(lambda i: i / 8)),
        st.integers(-5, 5),
        st.one_of(st.none(), st.sampled_from(["a", "b", "c", "dd", ""])),
        st.one_of(st.none(), st.integers(-20, 20).map(float)),
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=rows, seed=st.integers(0, 2**32 - 1))
def test_merging_random_batches_in_random_order_gives_the_same_stats(data, seed) -> None:
    table = pa.table(
        {name: [r[i] for r in data] for i, name in enumerate("xkcz")},
        schema=pa.schema(
            [("x", pa.float64()), ("k", pa.int64()), ("c", pa.string()), ("z", pa.float64())]
        ),
    )
    batch = table.to_batches()[0] if table.num_rows else None
    profiler = Profiler(table.schema)
    whole = profiler.partial(batch)
    expected = profiler.finish(whole, profiler.rank_partial(batch, whole)).to_dict()

    rnd = random.Random(seed)
    cuts = sorted(rnd.sample(range(1, len(data)), min(len(data) - 1, rnd.randint(0, 8))))
    pieces = [batch.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]

    def merge_randomly(parts: list[Any], merge: Any) -> Any:
        parts = list(parts)
        while len(parts) > 1:  # any tree shape, any order: needs associativity + commutativity
            a, b = (parts.pop(rnd.randrange(len(parts))) for _ in range(2))
            parts.append(merge(a, b) if rnd.random() < 0.5 else merge(b, a))
        return parts[0]

    merged = merge_randomly([profiler.partial(p) for p in pieces], profiler.merge)
    ranks = merge_randomly(
        [profiler.rank_partial(p, merged) for p in pieces], lambda a, b: a.merge(b)
    )
    close(profiler.finish(merged, ranks).to_dict(), expected)


def test_to_dict_round_trip_and_select(table: pa.Table) -> None:
    result = stats(fl.from_arrow(table))
    again = Stats.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again.to_dict() == result.to_dict()
    sub = again.select(["y", "c"])
    assert list(sub.columns) == ["y", "c"] and sub.correlation["columns"] == ["y"]


def normal_table(shift: float, seed: int, probs: list[float]) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = 5000
    return pa.table(
        {
            "x": rng.normal(shift, 1.0, n),
            "same": rng.normal(0.0, 1.0, n),
            "c": rng.choice(["a", "b", "c"], n, p=probs),
        }
    )


def test_drift_flags_a_shifted_mean_and_a_categorical_shift_only() -> None:
    ref = fl.from_arrow(normal_table(0.0, 1, [0.5, 0.3, 0.2]))
    same = compare(fl.from_arrow(normal_table(0.0, 2, [0.5, 0.3, 0.2])), ref)
    assert same.drifted == []
    assert all(c["psi"] < 0.05 for c in same.columns.values())
    moved = compare(fl.from_arrow(normal_table(1.0, 3, [0.2, 0.3, 0.5])), ref)
    assert moved.drifted == ["x", "c"]
    assert moved.columns["x"]["psi"] > 0.2 and moved.columns["x"]["ks"] > 0.3
    assert moved.columns["x"]["ks_pvalue"] < 1e-6 and moved.columns["c"]["psi"] > 0.2
    assert not moved.columns["same"]["drift"]
    json.dumps(moved.to_dict(), allow_nan=False)


def test_drift_ks_is_close_to_scipy_and_works_from_stored_dicts() -> None:
    a, b = normal_table(0.3, 4, [0.5, 0.3, 0.2]), normal_table(0.0, 5, [0.4, 0.4, 0.2])
    new, ref = stats(fl.from_arrow(a)), stats(fl.from_arrow(b))
    report = compare(new.to_dict(), ref.to_dict())
    exact = scipy_stats.ks_2samp(a["x"].to_numpy(), b["x"].to_numpy()).statistic
    assert report.columns["x"]["ks"] == pytest.approx(exact, abs=2 / 200)
    assert report.to_dict() == compare(new, ref).to_dict()


def test_ks_pvalue_matches_the_kolmogorov_distribution() -> None:
    for d, n, m in ((0.05, 800, 1200), (0.1, 300, 300), (0.02, 50_000, 40_000), (0.3, 20, 30)):
        ne = n * m / (n + m)
        lam = (math.sqrt(ne) + 0.12 + 0.11 / math.sqrt(ne)) * d
        assert ks_pvalue(d, n, m) == pytest.approx(scipy_stats.kstwobign.sf(lam), abs=1e-5)


def test_identifier_like_columns_are_not_compared() -> None:
    ref = pa.table({"id": [f"r{i}" for i in range(500)]})
    new = pa.table({"id": [f"n{i}" for i in range(500)]})
    column = compare(fl.from_arrow(new), fl.from_arrow(ref)).columns["id"]
    assert not column["drift"] and column["psi"] is None and "identifier" in column["note"]


def test_drift_flags_missing_columns_kind_changes_and_null_spikes() -> None:
    ref = pa.table({"x": [1.0, 2.0, 3.0, 4.0], "gone": [1, 2, 3, 4], "k": ["a", "b", "a", "b"]})
    new = pa.table({"x": [1.0, None, None, 4.0], "k": [1, 2, 1, 2]})
    report = compare(fl.from_arrow(new), fl.from_arrow(ref))
    assert report.columns["gone"]["reason"] == "missing in new"
    assert report.columns["k"]["reason"].startswith("kind changed")
    assert "null fraction" in report.columns["x"]["reason"]
    assert set(report.drifted) == {"x", "gone", "k"}


def test_write_stats_stores_the_same_statistics_in_the_manifest(table, tmp_path) -> None:
    out = tmp_path / "ds"
    fl.from_arrow(table).write(out, stats=True, rows_per_shard=1000)
    stored = fl.open(out).manifest.statistics
    close(stored, stats(fl.open(out)).to_dict())
    assert stored["rows"] == table.num_rows
    fl.from_arrow(table).write(out)  # a rewrite without stats=True drops them
    assert fl.open(out).manifest.statistics == {}


def test_cli_stats_prints_tables_and_writes_json(table, tmp_path, capsys) -> None:
    out = tmp_path / "ds"
    fl.from_arrow(table).write(out, stats=True)
    capsys.readouterr()
    assert main(["stats", str(out), "--columns", "x,c", "--json", str(tmp_path / "s.json")]) == 0
    text = capsys.readouterr().out
    assert "stored in the manifest" in text and "quantiles" in text and "red" in text
    doc = json.loads((tmp_path / "s.json").read_text())
    assert list(doc["columns"]) == ["x", "c"]
    assert main(["stats", str(out), "--recompute"]) == 0
    assert "stored in the manifest" not in capsys.readouterr().out


def test_cli_against_flags_drift_and_exit_codes(tmp_path, capsys) -> None:
    fl.from_arrow(normal_table(0.0, 1, [0.5, 0.3, 0.2])).write(tmp_path / "ref", stats=True)
    fl.from_arrow(normal_table(1.0, 3, [0.2, 0.3, 0.5])).write(tmp_path / "new")
    fl.from_arrow(normal_table(0.0, 2, [0.5, 0.3, 0.2])).write(tmp_path / "same")
    ref = str(tmp_path / "ref")
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "new"), "--against", ref]) == 0
    text = capsys.readouterr().out
    assert "DRIFT" in text and "DRIFT in 2 of 3 column(s): x, c" in text
    assert main(["stats", str(tmp_path / "new"), "--against", ref, "--fail-on-drift"]) == 1
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "same"), "--against", ref, "--fail-on-drift"]) == 0
    assert "No drift in 3 column(s)" in capsys.readouterr().out


def test_image_width_height_distribution_from_headers(tmp_path) -> None:
    image = pytest.importorskip("PIL.Image")
    folder = tmp_path / "imgs" / "cats"
    folder.mkdir(parents=True)
    sizes = [(64, 48), (64, 48), (32, 16), (100, 80)]
    for i, size in enumerate(sizes):
        buffer = io.BytesIO()
        image.new("L" if i == 2 else "RGB", size).save(buffer, "PNG" if i % 2 else "JPEG")
        (folder / f"{i}.{'png' if i % 2 else 'jpg'}").write_bytes(buffer.getvalue())
    (folder / "bad.png").write_bytes(b"not an image at all")
    s = stats(fl.read_images(tmp_path / "imgs"))["bytes"]
    assert s["kind"] == "image" and s["count"] == 5 and s["unreadable"] == 1
    widths = np.array([w for w, _ in sizes], float)
    assert s["width"]["mean"] == widths.mean() and s["height"]["max"] == 80
    assert s["width"]["quantiles"]["p50"] == np.quantile(widths, 0.5)
    assert s["top_sizes"][0] == ["64x48", 2] and ["L", 1] in s["modes"]
