"""``demo --workload metagene`` end to end, small: 2 DiLoCo peers (real nodes, real averager
children) pretrain the tiny preset on a generated metagenome's read store for a few rounds; the
outputs exist, the peers agree on the state hash, and evaluation ran before and after."""

from __future__ import annotations

import json

import pytest

from intellect_node.node.demo.metagene import MetageneDemoOptions, run_metagene_demo


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_metagene_demo_two_peers(tmp_path) -> None:
    options = MetageneDemoOptions(peers=2, rounds=2, H=3, batch=4, minutes=3.0, out=tmp_path, organisms=2,
                                  reads_per_organism=150, eval_reads_per_organism=20, genome_length=3000, vocab=128,
                                  seq_len=128)
    lines: list[str] = []
    summary = run_metagene_demo(options, lines.append)
    assert summary["stopped_by"] == "rounds", (summary, lines)
    assert all(n >= 2 for n in summary["rounds_done"].values())
    assert summary["same_state_hash_there"] and summary["newest_common_round"] is not None
    written = json.loads((tmp_path / "summary.json").read_text())
    assert written["workload"] == "metagene" and written["train_reads"] == 300 and written["eval_reads"] == 40
    for key in ("probe_mcc_before", "probe_mcc_after", "kmer_mcc"):
        assert -1.0 <= written[key] <= 1.0
    assert written["evaluated"]["round"] >= 2 and written["after"]["perplexity"] > 1.0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {r["node"] for r in records} == {"peer0", "peer1"} and all(r["tokens"] > 0 for r in records)
    assert (tmp_path / "loss.png").stat().st_size > 0
    # the peers' stores hold the reads once; their final states agree bit for bit at the common round
    at = {r["node"]: r["state_hash"] for r in records if r["round"] == written["newest_common_round"]}
    assert len(set(at.values())) == 1
