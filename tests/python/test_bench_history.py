"""bench/delta_rule_history.py's reading of the committed benchmark tables (no GPU, no plot)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("delta_rule_history", ROOT / "bench" / "delta_rule_history.py")
history = importlib.util.module_from_spec(spec)
spec.loader.exec_module(history)

TABLE = """# Session 31 runs

## Run 31.2 (commit abc)

| case | B T H K | flashgrad fwd | fla fwd | fla/fg fwd | flashgrad bwd | fla bwd | fla/fg bwd |
|---|---|---|---|---|---|---|---|
| chunk GDN | 8 4096 16 128 | 0.878 | 0.856 | 0.97x | **2.599** | 2.744 | 1.06x |
| chunk GDN | 1 32768 16 128 | 1.171 | 1.440 | 1.23x | 3.172 | 4.707 | 1.48x |
| chunk GDN K=V=64 | 8 4096 16 64 | 0.497 | 0.585 | 1.18x | 1.545 | 2.527 | 1.63x |
| recurrent GDN | 4 4096 16 128 | 7.093 | 5.909 | 0.83x | 18.664 | n/a | n/a |
| chunk KDA | 4 4096 16 128 | 1.167 | 0.941 | 0.81x | 3.816 | 4.188 | 1.10x |
| something else | 1 2 3 4 | 1 | 2 | - | 3 | 4 | - |
"""


def test_reads_rows_by_case_and_run(tmp_path):
    (tmp_path / "session31_runs_h200.md").write_text(TABLE)
    (tmp_path / "delta_rule_session31_run2.md").write_text(TABLE.split("## Run 31.2 (commit abc)\n")[1])
    runs = history.collect(str(tmp_path))
    assert len(runs) == 1, "the same run's table in two files is one run"
    sess, label, rows = runs[0]
    assert (sess, label) == (31, "31.2")
    assert rows["b8"] == (0.878, 0.856, 2.599, 2.744)  # bold cells read
    assert rows["t32k"] == (1.171, 1.440, 3.172, 4.707)
    assert rows["k64"][0] == 0.497 and rows["kda"][3] == 4.188
    assert rows["rec"] == (7.093, 5.909, 18.664, None)
    assert set(rows) == {"b8", "t32k", "k64", "kda", "rec"}
    md = history.latest_table(runs)
    assert "| 31 (31.2) | 0.878 / 2.599 (0.97x / 1.06x) |" in md
    assert "7.093 / 18.664 (2.63x)" in md


def test_committed_results_parse():
    runs = history.collect(str(ROOT / "bench" / "results"))
    assert len(runs) >= 20
    assert any(r[2].get("b8", (None,))[0] for r in runs)
