"""Every shard count the schema allows plans: names run from shard-000 to shard-4095 (three digits
while they fit, so caches made with fewer shards keep their file names)."""
import re

import pytest
import yaml
from conftest import ROOT, snakemake, write_config

MAX_SHARDS = yaml.safe_load((ROOT / "configs" / "schema.yaml").read_text())["properties"]["cache"]["properties"]["shards"]["maximum"]


@pytest.mark.slow
def test_dry_run_at_the_schemas_maximum_shard_count_plans_every_shard(tmp_path, corpus_template):
    assert MAX_SHARDS > 1000  # four-digit names are the case under test
    config = write_config(tmp_path, corpus_template, cache={"dir": str(tmp_path / "cache"), "shards": MAX_SHARDS})
    out = snakemake("caches", "-n", "-p", config=config).stdout
    for rule in ("token_shard", "mel_shard", "pitch_shard"):
        blocks = [b for b in re.split(r"^rule ", out, flags=re.MULTILINE) if b.startswith(f"{rule}:")]
        shards = [re.search(r"wildcards: shard=(\d+)", b).group(1) for b in blocks]
        assert sorted(map(int, shards)) == list(range(MAX_SHARDS)), f"{rule}: {len(shards)} of {MAX_SHARDS} shards planned"
        assert {"000", "999", "1000", str(MAX_SHARDS - 1)} <= set(shards)
    # every command fits in one argument of `bash -c` (Linux: 128 KiB), cache_index's too
    commands = [line for line in out.splitlines() if "python -m pipeline." in line]
    assert any("pipeline.cache index" in c for c in commands)
    assert max(len(c.encode()) for c in commands) < 128 * 1024


def test_the_index_reads_shards_in_shard_order_past_shard_999(tmp_path):
    from pipeline import cache
    cfg = {"name": "t", "cache": {"dir": str(tmp_path), "shards": 1002}}
    paths = cache.shard_paths(cfg)
    assert [p.name for p in paths["mels"][998:]] == ["shard-998.json", "shard-999.json", "shard-1000.json",
                                                      "shard-1001.json"]
    shuffled = list(reversed(paths["pitch"]))
    assert sorted(shuffled, key=cache._shard_number) == paths["pitch"]
