"""The shard caches after a real `snakemake caches`: what each file holds, atomic writes, bad audio,
and audio in other rates, bit depths, channel counts and containers.

    python -m pytest -q tests/test_cache.py
"""
import errno
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from conftest import ROOT, left_in_tmpdir, planned_jobs, snakemake, write_config

from pipeline import audio, cache, config, manifest, pitch, shards, text
from pipeline.errors import PipelineError

HOP, N_MELS, SR = 256, 80, 22050


def _rows(meta_path):
    """{id: text the front end reads}, parsed here from the LJSpeech layout."""
    rows = {}
    for line in Path(meta_path).read_text(encoding="utf-8-sig").splitlines():
        cols = line.split("|")
        rows[cols[0]] = (cols[2] if len(cols) == 3 and cols[2].strip() else cols[1]).strip()
    return rows


def _load(cache_dir, kind, shard):
    prefix = cache_dir / kind / f"shard-{shard:03d}"
    return prefix, json.loads(Path(f"{prefix}.json").read_text())


# --- what a built cache holds -------------------------------------------------------------------
@pytest.mark.slow
def test_built_cache_contents(built_cache):
    cfg = config.load_config(built_cache)
    cache_dir = config.cache_dir(cfg)
    rows = _rows(Path(cfg["dataset"]["root"]) / cfg["dataset"]["metadata"])
    index = json.loads((cache_dir / "index.json").read_text())
    n = cfg["cache"]["shards"]
    assert len(index["shards"]) == n and index["format"] == shards.FORMAT

    seen, train, clips, val = set(), {"mels": [], "energy": [], "pitch": []}, 0, 0
    used = set()
    for k in range(n):
        tmeta, tokens = shards.read(shards.prefix(cache_dir, "tokens", k), "tokens")
        for cid, points in zip(tmeta["ids"], tokens):
            assert manifest.shard_of(cid, n) == k
            symbols, _ = text.to_symbols([rows[cid]], cfg["text"])[0]
            assert "".join(map(chr, points)) == symbols + text.EOS  # code points of the phonemes, EOS last
            used.update(symbols)
        assert tmeta["espeak"] == text.espeak_version()
        metas = {kind: shards.read(shards.prefix(cache_dir, kind, k), kind) for kind in ("mels", "energy", "pitch")}
        ids = metas["mels"][0]["ids"]
        assert sorted(ids) == sorted(tmeta["ids"]) and all(metas[kind][0]["ids"] == ids for kind in metas)
        for i, cid in enumerate(ids):
            path = manifest.audio_path(cfg["dataset"]["root"], cfg["dataset"]["audio_dir"], cid)
            y = audio.load_audio(path, sample_rate=SR, max_seconds=20.0)
            frames = audio.n_frames(sf.info(str(path)).frames, HOP)
            spec = audio.stft_magnitude(y, n_fft=1024, hop_length=HOP, win_length=1024)
            ref = audio.mel_spectrogram(y, **cfg["audio"])
            f0 = pitch.f0(y, sample_rate=SR, hop_length=HOP, n_frames=frames, **cfg["pitch"])
            got = {kind: metas[kind][1][i].astype(np.float32) for kind in metas}
            # the same frame count for mel, energy and pitch of every clip
            assert [len(got[kind]) for kind in metas] == [frames] * 3 == [len(ref)] * 3
            # float16 keeps 11 significant bits: half a unit in the last place is 2**-11 relative
            np.testing.assert_allclose(got["mels"], ref, rtol=2 ** -11, atol=1e-6)
            np.testing.assert_allclose(got["energy"], audio.energy_from_magnitude(spec), rtol=1e-6)
            np.testing.assert_array_equal(got["pitch"], f0)
            assert 0.3 < np.mean(f0 > 0) < 1 and 60 < np.median(f0[f0 > 0]) < 200  # espeak's voice, voiced and not
            if manifest.is_validation(cid, cfg["dataset"]["val_fraction"]):
                val += 1
            else:
                for kind in metas:
                    train[kind].append(got[kind].astype(np.float64))
        seen |= set(ids)
        clips += len(ids)

    assert seen == set(rows) and clips == len(rows)
    assert 0 < val < clips  # both splits are present, so the statistics below test the split
    counts = index["counts"]
    assert counts["clips"] == clips and counts["val"] == val and counts["train"] == clips - val
    assert counts["rejected"] == 0
    assert sum(s["clips"] for s in index["shards"]) == clips
    assert sum(s["val"] for s in index["shards"]) == val
    mels = np.concatenate(train["mels"])
    np.testing.assert_allclose(index["mel_mean"], mels.mean(0), rtol=0, atol=2e-3)
    np.testing.assert_allclose(index["mel_std"], mels.std(0), rtol=0, atol=2e-3)
    energy, f0 = np.concatenate(train["energy"]), np.concatenate(train["pitch"])
    voiced = f0[f0 > 0]
    assert index["energy_mean"] == pytest.approx(energy.mean(), rel=1e-5)
    assert index["energy_std"] == pytest.approx(energy.std(), rel=1e-4)
    assert index["pitch_mean"] == pytest.approx(voiced.mean(), abs=1e-3)
    assert index["pitch_std"] == pytest.approx(voiced.std(), abs=1e-3)
    assert index["n_mels"] == N_MELS
    vocab = json.loads((cache_dir / "vocab.json").read_text())
    assert vocab == index["vocab"] == text.vocabulary(cfg["text"], espeak=text.espeak_version())
    assert vocab["symbols"][:2] == ["_", "~"] and "ˈ" in used and used <= set(vocab["symbols"])  # stress kept
    assert (cache_dir / "rejected.tsv").read_text().splitlines() == ["id\tshard\tstage\tpath\treason"]


@pytest.mark.slow
def test_pitch_job_reads_the_mel_jobs_audio_shard_only_when_it_holds_these_clips(built_cache, tmp_path):
    """One decode per clip: the pitch job takes the waveforms from the audio shard the mel job wrote,
    and decodes the clips itself when that shard is of other files or settings or does not match its
    JSON (a mel job rewriting it): the same F0 bytes on every path."""
    cfg = config.load_config(built_cache)
    cache_dir = config.cache_dir(cfg)
    built = shards.read(shards.prefix(cache_dir, "pitch", 1), "pitch")[1]
    copy = tmp_path / "audio" / "shard-001"
    copy.parent.mkdir()
    for suffix in (".json", ".bin"):
        shutil.copy(shards.prefix(cache_dir, "audio", 1).with_suffix(suffix), copy.with_suffix(suffix))

    def pitch_job(name):
        said = []
        cache.build_pitch_shard(cfg, 1, tmp_path / name, audio_shard=copy, log=said.append)
        assert [t.tolist() for t in shards.read(tmp_path / name, "pitch")[1]] == [t.tolist() for t in built]
        return " ".join(said)

    assert f"clips from {copy.with_suffix('.bin')}" in pitch_job("read")
    meta = json.loads(copy.with_suffix(".json").read_text())
    copy.with_suffix(".json").write_text(json.dumps(dict(meta, decoded="another file or hop")))
    assert "is not of these clips' files or settings: decoding them" in pitch_job("other_files")
    copy.with_suffix(".json").write_text(json.dumps(meta))
    data = bytearray(copy.with_suffix(".bin").read_bytes())
    data[100] ^= 0xFF
    copy.with_suffix(".bin").write_bytes(bytes(data))
    assert "does not match its JSON (being rewritten?): decoding the clips" in pitch_job("rewritten")
    copy.with_suffix(".json").unlink()
    assert "no audio shard to read" in pitch_job("missing")


def test_line_that_phonemizes_to_nothing_is_rejected_with_its_reason(tmp_path, corpus_template):
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    lines = (root / "metadata.csv").read_text(encoding="utf-8").splitlines()
    cid = lines[3].split("|")[0]
    lines[3] = f"{cid}|... !|... !"
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = config.load_config(write_config(tmp_path, root))
    k = manifest.shard_of(cid, cfg["cache"]["shards"])
    out = shards.prefix(config.cache_dir(cfg), "tokens", k)
    cache.build_token_shard(cfg, k, out, log=lambda *a: None)
    meta = shards.read_meta(out, "tokens")
    assert cid not in meta["ids"] and len(meta["ids"]) > 0
    assert meta["rejected"] == [dict(id=cid, path=f"{root / 'metadata.csv'}:4", stage="tokens",
                                     reason="text '... !': gives no phonemes (nothing to say)")]


# --- atomic writes ------------------------------------------------------------------------------
@pytest.fixture
def big_shard(tmp_path, corpus_template):
    """A one-shard corpus of 96 clips (the template's 24, each also under 3 more ids)."""
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    lines = (root / "metadata.csv").read_text(encoding="utf-8").splitlines()
    extra = []
    for copy in range(1, 4):
        for line in lines:
            cid, rest = line.split("|", 1)
            shutil.copy(root / "wavs" / f"{cid}.wav", root / "wavs" / f"{cid}-x{copy}.wav")
            extra.append(f"{cid}-x{copy}|{rest}")
    (root / "metadata.csv").write_text("\n".join(lines + extra) + "\n", encoding="utf-8")
    return root, write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": 1})


@pytest.mark.slow
def test_killed_mel_job_leaves_no_shard_and_snakemake_rebuilds_it(big_shard, tmp_path):
    root, cfg_path = big_shard
    out = tmp_path / "cache" / "t" / "mels" / "shard-000"
    energy = tmp_path / "cache" / "t" / "energy" / "shard-000"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cache", "mels", "--config", str(cfg_path), "--shard", "0",
                             "--out", str(out), "--energy", str(energy)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True)
    try:
        seen = []
        for line in proc.stdout:  # the first progress line comes after 50 of the 96 clips
            seen.append(line)
            if "50/96 clips" in line:
                break
        assert "50/96 clips" in seen[-1], "".join(seen)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    for prefix in (out, energy):
        for suffix in (".json", ".bin", ".stats.npy"):
            assert not Path(f"{prefix}{suffix}").exists(), f"{prefix}{suffix} written by a killed job"
    with pytest.raises(shards.CacheError, match="missing"):
        shards.read_meta(out, "mels")

    assert planned_jobs(cfg_path)["mel_shard"] == 1
    snakemake("caches", config=cfg_path)
    meta = shards.read_meta(out, "mels")
    assert len(meta["ids"]) == 96
    assert Path(f"{out}.bin").stat().st_size == meta["bytes"]
    assert planned_jobs(cfg_path) == {}


# --- bad audio ----------------------------------------------------------------------------------
def _ids_in_shard(prefix, shard, shards, n):
    out, i = [], 0
    while len(out) < n:
        cid = f"{prefix}{i}"
        if manifest.shard_of(cid, shards) == shard:
            out.append(cid)
        i += 1
    return out


def _write_bad(wavs, kind, cid, good):
    """One bad file of `kind` for clip `cid`; `good` is a real 22050 Hz clip to start from."""
    path = wavs / f"{cid}.wav"
    if kind == "missing":
        return path
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":  # cut in the middle of its data: the header still claims it all
        data = good.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    elif kind == "not_audio":
        path.write_text("id|text\nthis is a text file, not a wav\n")
    elif kind == "nan":
        y = sf.read(str(good), dtype="float32")[0]
        y[len(y) // 3] = np.nan
        y[len(y) // 2] = np.inf
        sf.write(str(path), y, SR, subtype="FLOAT")
    elif kind == "silent":
        sf.write(str(path), np.zeros(SR * 2, np.float32), SR, subtype="PCM_16")
    elif kind == "too_long":  # dataset.max_seconds is 20
        y = sf.read(str(good), dtype="float32")[0]
        sf.write(str(path), np.tile(y, int(np.ceil(21 * SR / len(y)))), SR, subtype="PCM_16")
    elif kind in ("integer_scaled", "huge"):  # float files beyond full scale: loud mels, or infinite ones
        y = sf.read(str(good), dtype="float32")[0]
        sf.write(str(path), y / np.abs(y).max() * (26438.0 if kind == "integer_scaled" else 1e30), SR, subtype="FLOAT")
    elif kind == "cancelling":  # stereo, the right channel the left one inverted: silence once mixed to mono
        y = sf.read(str(good), dtype="float32")[0]
        sf.write(str(path), np.stack([y, -y], axis=1), SR, subtype="PCM_16")
    elif kind in ("near_silent", "dc"):  # a peak above audio.SILENCE_PEAK, yet no speech
        y = np.zeros(SR * 10, np.float32) if kind == "near_silent" else np.full(SR * 2, 0.5, np.float32)
        y[SR] = 0.001 if kind == "near_silent" else y[SR]
        sf.write(str(path), y, SR, subtype="PCM_16")
    elif kind == "near_cancelling":  # a lead wired out of phase: the other channel inverted, 1 % quieter
        y = sf.read(str(good), dtype="float32")[0]
        sf.write(str(path), np.stack([y, -0.99 * y], axis=1), SR, subtype="PCM_16")
    elif kind == "dc_speech":  # speech on a cheap interface's 3 % offset
        y = sf.read(str(good), dtype="float32")[0]
        sf.write(str(path), y * 0.9 + 0.03, SR, subtype="PCM_16")
    elif kind == "adpcm":
        sf.write(str(path), sf.read(str(good), dtype="float32")[0], SR, subtype="IMA_ADPCM")
    elif kind in ("clipped", "eight_bit", "narrow_band"):
        y = sf.read(str(good), dtype="float32")[0]
        if kind == "narrow_band":  # telephone audio, 8 kHz, with audio.fmax 8000
            sf.write(str(path), soxr.resample(y, SR, 8000), 8000, subtype="PCM_16")
        else:  # speech x20: about a quarter of its samples at full scale; or 8-bit samples
            loud = np.clip(y / np.abs(y).max() * 20, -1, 1) if kind == "clipped" else y
            sf.write(str(path), loud, SR, subtype="PCM_16" if kind == "clipped" else "PCM_U8")
    return path


BAD_KINDS = {  # kind: words the rejected reason must contain (any of)
    "missing": ("missing",),
    "empty": ("empty", "not readable"),
    "truncated": ("truncated",),
    "not_audio": ("not readable", "not audio"),
    "nan": ("nan",),
    "silent": ("silent", "silence"),
    "too_long": ("too long", "max_seconds"),
    "integer_scaled": ("samples reach 2.64e+04, beyond full scale",),
    "huge": ("samples reach 1e+30, beyond full scale",),
    "cancelling": ("its 2 channels cancel when mixed to mono",),
    "near_silent": ("no speech: 0.0% of its 20 ms frames reach -60 dbfs (at least 2% must)",),
    "dc": ("a constant offset of 0.5 (dc) removed",),
    "clipped": ("clipped: ",),
    "eight_bit": ("8-bit samples (pcm_u8)",),
    "near_cancelling": ("mixed to mono, its 2 channels are 46 db below the loudest one",),
    "dc_speech": ("a constant offset (dc) of 0.03",),
    "adpcm": ("coarsely coded samples (ima_adpcm)",),
    "narrow_band": ("recorded at 8000 hz, which holds nothing above 4000 hz, but audio.fmax is 8000 hz",),
}


@pytest.mark.slow
def test_bad_audio_skip_then_fail(tmp_path, corpus_template):
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root)
    shards, bad_shard = 2, 1
    lines = (root / "metadata.csv").read_text(encoding="utf-8").splitlines()
    good = root / "wavs" / f"{lines[2].split('|')[0]}.wav"
    bad_ids = dict(zip(BAD_KINDS, _ids_in_shard("bad-", bad_shard, shards, len(BAD_KINDS))))
    bad_paths = {kind: _write_bad(root / "wavs", kind, cid, good) for kind, cid in bad_ids.items()}
    rows = [f"{cid}|A bad clip of kind {kind}.|A bad clip of kind {kind}." for kind, cid in bad_ids.items()]
    (root / "metadata.csv").write_text("\n".join(lines + rows) + "\n", encoding="utf-8")
    good_in_bad_shard = sorted(line.split("|")[0] for line in lines
                               if manifest.shard_of(line.split("|")[0], shards) == bad_shard)
    assert good_in_bad_shard, "the bad clips' shard should also hold good clips"

    # with bad_audio: skip the bad clips are left out and listed with their reasons
    cache_cfg = {"dir": str(tmp_path / "cache"), "shards": shards}
    cfg_path = write_config(tmp_path, root, dataset={"root": str(root), "bad_audio": "skip"}, cache=cache_cfg)
    snakemake("caches", config=cfg_path)
    cache_dir = tmp_path / "cache" / "t"
    meta = json.loads((cache_dir / "mels" / f"shard-{bad_shard:03d}.json").read_text())
    assert sorted(meta["ids"]) == good_in_bad_shard
    index = json.loads((cache_dir / "index.json").read_text())
    assert index["counts"]["clips"] == len(lines)
    assert index["counts"]["rejected"] == len(BAD_KINDS)
    table = (cache_dir / "rejected.tsv").read_text().splitlines()
    assert table[0].split("\t") == ["id", "shard", "stage", "path", "reason"]
    reasons = {r.split("\t")[0]: r.split("\t") for r in table[1:]}
    assert set(reasons) == set(bad_ids.values())
    for kind, cid in bad_ids.items():
        _, shard, stage, path, reason = reasons[cid]
        assert Path(path).name.startswith(cid) and shard == str(bad_shard) and stage in ("mels", "pitch")
        assert any(w in reason.lower() for w in BAD_KINDS[kind]), (kind, reason)
    assert planned_jobs(cfg_path) == {}

    # with bad_audio: fail the index records them and every job that reads it refuses, `snakemake
    # caches` too; flipping the key rebuilds no shard (each builds the same bytes either way), the
    # shards are kept (the failing shard job deleted its shard before), and so is the index: a failed
    # index job's outputs would be deleted, and a trained aligner (which reads it as `ancient`) retrained
    fail_path = write_config(tmp_path, root, dataset={"root": str(root), "bad_audio": "fail"}, cache=cache_cfg)
    assert planned_jobs(fail_path) == {"cache_index": 1, "caches": 1}
    assert planned_jobs(fail_path, "train") == {"cache_index": 1, "train_aligner": 1, "duration_shard": shards, "train": 1}
    built = {p: p.stat().st_mtime_ns for p in cache_dir.rglob("shard-*")}
    logs = cache_dir.parent.parent / "reports" / "t" / "logs"
    for target, log in (("caches", logs / "caches.log"), ("caches", logs / "caches.log"),
                        ("train", logs / "train_aligner.log")):  # again and again, until they are mended
        proc = snakemake(target, config=fail_path, check=False)
        assert proc.returncode != 0
        assert str(log) in proc.stdout + proc.stderr  # Snakemake points the user at the failed job's log
        message = next(line for line in log.read_text().splitlines() if line.startswith("error: "))
        assert f"{cache_dir / 'index.json'}: dataset.bad_audio: fail: {len(BAD_KINDS)} clip(s) with bad audio" in message
        for kind, path in bad_paths.items():
            assert (bad_ids[kind] if kind == "missing" else str(path)) in message, kind
        assert {p: p.stat().st_mtime_ns for p in cache_dir.rglob("shard-*")} == built
        assert json.loads((cache_dir / "index.json").read_text())["bad_audio"]["clips"] == len(BAD_KINDS)
        assert not list((tmp_path / "runs").rglob("ckpt-*")) and not list((tmp_path / "runs").rglob("aligner.json"))
    assert planned_jobs(fail_path) == {"caches": 1}

    # a clip whose text is refused as well is still bad audio (rejected.tsv gives it its text's row)
    (twice,) = _ids_in_shard("twice-", 0, shards, 1)
    _write_bad(root / "wavs", "silent", twice, good)
    with open(root / "metadata.csv", "a", encoding="utf-8") as f:
        f.write(f"{twice}|Smile \U0001F600 now.|Smile \U0001F600 now.\n")
    assert snakemake("caches", config=fail_path, check=False).returncode != 0
    assert f"fail: {len(BAD_KINDS) + 1} clip(s) with bad audio" in (logs / "caches.log").read_text()

    # back to skip: the index again, with the bad clips left out, and no shard
    cfg_path = write_config(tmp_path, root, dataset={"root": str(root), "bad_audio": "skip"}, cache=cache_cfg)
    assert planned_jobs(cfg_path) == {"cache_index": 1, "caches": 1}
    built = {p: p.stat().st_mtime_ns for p in cache_dir.rglob("shard-*")}
    snakemake("caches", config=cfg_path)
    index = json.loads((cache_dir / "index.json").read_text())
    assert "bad_audio" not in index and index["counts"]["rejected"] == len(BAD_KINDS) + 1
    assert {p: p.stat().st_mtime_ns for p in cache_dir.rglob("shard-*")} == built
    assert planned_jobs(cfg_path) == {}


@pytest.mark.parametrize("kind", sorted(BAD_KINDS))
def test_each_bad_audio_kind_is_rejected_by_the_shard_jobs_loader(tmp_path, corpus_template, kind):
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    path = _write_bad(tmp_path, kind, "clip", good)
    with pytest.raises(audio.BadAudio) as e:
        cache.load_clip(path, sample_rate=SR, max_seconds=20.0, fmax=8000.0)
    assert any(w in str(e.value).lower() for w in BAD_KINDS[kind]), str(e.value)


def test_quiet_paused_normalised_and_16_khz_speech_is_kept(tmp_path, corpus_template):
    # the speech checks' margins: every demo clip (16 kHz, audio.fmax 8000 = its Nyquist frequency),
    # and speech 40 dB quieter, with long pauses, or normalised to peak 1.0
    for path in sorted((ROOT / "data" / "demo" / "wavs").glob("*.flac")):
        assert cache.active_fraction(cache.load_clip(path, sample_rate=SR, max_seconds=20.0, fmax=8000.0), SR) > 0.5
    y = sf.read(str(sorted((corpus_template / "wavs").glob("*.wav"))[2]), dtype="float32")[0]
    pause = np.zeros(3 * SR, np.float32)
    for name, wave in {"quiet": y * 0.01, "paused": np.concatenate([y[:SR], pause, pause, y[SR:2 * SR], pause]),
                       "normalised": y / np.abs(y).max()}.items():
        sf.write(str(tmp_path / f"{name}.wav"), wave, SR, subtype="PCM_16")
        assert len(cache.load_clip(tmp_path / f"{name}.wav", sample_rate=SR, max_seconds=20.0, fmax=8000.0)) == len(wave)
    # without fmax (a pitch job: no audio.fmax setting) the 8 kHz rate is no reason
    _write_bad(tmp_path, "narrow_band", "tel", sorted((corpus_template / "wavs").glob("*.wav"))[2])
    assert len(cache.load_clip(tmp_path / "tel.wav", sample_rate=SR, max_seconds=20.0)) > 0


def test_clipping_is_counted_on_the_files_own_samples(tmp_path, corpus_template):
    # resampled from 44.1 kHz and mixed from stereo, a clipped clip's flat tops no longer sit at 1.0
    y = sf.read(str(sorted((corpus_template / "wavs").glob("*.wav"))[2]), dtype="float32")[0]
    y = soxr.resample(y / np.abs(y).max(), SR, 44100)
    for gain in (1, 20):
        wave = np.clip(y * gain, -1, 1)
        sf.write(str(tmp_path / f"x{gain}.flac"), np.stack([wave, wave * 0.9], axis=1), 44100, subtype="PCM_24")
    assert len(cache.load_clip(tmp_path / "x1.flac", sample_rate=SR, max_seconds=20.0)) > 0
    with pytest.raises(audio.BadAudio, match=r"^clipped: 1\d\.\d% of its samples are at full scale \(more than 1%\)"):
        cache.load_clip(tmp_path / "x20.flac", sample_rate=SR, max_seconds=20.0)
    # mono at 16 kHz, overdriven 4x: resampled, its flat tops overshoot 1.0 and the file is counted
    mono = soxr.resample(y, 44100, 16000)
    sf.write(str(tmp_path / "m4.wav"), np.clip(mono * 4, -1, 1), 16000, subtype="PCM_16")
    with pytest.raises(audio.BadAudio, match=r"^clipped: "):
        cache.load_clip(tmp_path / "m4.wav", sample_rate=SR, max_seconds=20.0)


def test_lossy_files_are_counted_clipped_from_where_their_decoder_rings(tmp_path, corpus_template):
    # an MP3 or Vorbis decoder rings around flattened peaks (0.95-1.15): few samples sit at exactly 1.0,
    # and speech clipped 4x before encoding was kept
    y = sf.read(str(sorted((corpus_template / "wavs").glob("*.wav"))[2]), dtype="float32")[0]
    y = y / np.abs(y).max()
    for fmt, subtype, ext in (("MP3", "MPEG_LAYER_III", "mp3"), ("OGG", "VORBIS", "ogg")):
        for gain in (1, 4):
            sf.write(str(tmp_path / f"x{gain}.{ext}"), np.clip(y * gain, -1, 1) * 0.999, SR, format=fmt,
                     subtype=subtype)
        assert len(cache.load_clip(tmp_path / f"x1.{ext}", sample_rate=SR, max_seconds=20.0)) > 0  # peak-normalised
        with pytest.raises(audio.BadAudio, match=r"^clipped: [2-9]\.\d% of its samples"):
            cache.load_clip(tmp_path / f"x4.{ext}", sample_rate=SR, max_seconds=20.0)


def test_channels_that_mostly_cancel_and_a_dc_offset_are_refused_others_kept(tmp_path, corpus_template):
    y = sf.read(str(sorted((corpus_template / "wavs").glob("*.wav"))[2]), dtype="float32")[0]
    delayed = np.concatenate([[0.0], -y[:-1]]).astype(np.float32)  # inverted, a sample later
    cases = {"same": np.stack([y, y], 1), "one_side": np.stack([y, np.zeros_like(y)], 1),
             "spaced": np.stack([y, np.concatenate([[0.0] * 28, y[:-28]])], 1),          # two microphones
             "inverted_delayed": np.stack([y, delayed], 1), "inverted_quieter": np.stack([y, -0.9 * y], 1)}
    for name, stereo in cases.items():
        sf.write(str(tmp_path / f"{name}.wav"), stereo, SR, subtype="PCM_16")
    for name in ("same", "one_side", "spaced"):  # 0, 6 and a few dB: kept
        assert len(cache.load_clip(tmp_path / f"{name}.wav", sample_rate=SR, max_seconds=20.0)) > 0, name
    for name in ("inverted_delayed", "inverted_quieter"):
        with pytest.raises(audio.BadAudio, match=r"^mixed to mono, its 2 channels are \d+ dB below the loudest one"):
            cache.load_clip(tmp_path / f"{name}.wav", sample_rate=SR, max_seconds=20.0)
    for offset, kept in ((0.005, True), (0.02, False)):
        sf.write(str(tmp_path / "dc.wav"), y * 0.9 + offset, SR, subtype="PCM_16")
        if kept:
            assert len(cache.load_clip(tmp_path / "dc.wav", sample_rate=SR, max_seconds=20.0)) > 0
        else:
            with pytest.raises(audio.BadAudio, match=r"^a constant offset \(DC\) of 0\.02\d* \(more than 0\.01\)"):
                cache.load_clip(tmp_path / "dc.wav", sample_rate=SR, max_seconds=20.0)


def test_a_corpus_all_at_8_khz_stops_the_index_naming_the_rate_and_fmax(tmp_path, corpus_template):
    root = tmp_path / "data"
    shutil.copytree(corpus_template, root, ignore=shutil.ignore_patterns("*.wav"))
    lines = (root / "metadata.csv").read_text(encoding="utf-8").splitlines()[:3]
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for line in lines:
        cid = line.split("|")[0]
        _write_bad(root / "wavs", "narrow_band", cid, corpus_template / "wavs" / f"{cid}.wav")
    cfg = config.load_config(write_config(tmp_path, root, cache={"dir": str(tmp_path / "cache"), "shards": 1},
                                          text={"frontend": "characters"}))
    cache_dir, quiet = config.cache_dir(cfg), (lambda *a: None)
    cache.build_token_shard(cfg, 0, shards.prefix(cache_dir, "tokens", 0), log=quiet)
    cache.build_mel_shard(cfg, 0, shards.prefix(cache_dir, "mels", 0), shards.prefix(cache_dir, "energy", 0),
                          shards.prefix(cache_dir, "audio", 0), log=quiet)
    said = []
    cache.build_pitch_shard(cfg, 0, shards.prefix(cache_dir, "pitch", 0), shards.prefix(cache_dir, "audio", 0),
                            log=said.append)
    assert any("left out clips for audio.fmax" in line for line in said)  # it decodes them itself
    assert shards.read_meta(shards.prefix(cache_dir, "pitch", 0), "pitch")["rejected"] == []
    with pytest.raises(PipelineError) as e:
        cache.build_index(cfg, cache.shard_paths(cfg), cache_dir / "index.json", log=quiet)
    assert str(e.value).startswith(
        f"no training clips in {root}: every clip was rejected or in validation (3 rejected, 0 in validation); 3 of "
        "them (mels): recorded at 8000 Hz, which holds nothing above 4000 Hz, but audio.fmax is 8000 Hz")
    assert "lower audio.fmax to 4000 or use wider-band recordings (e.g. " in str(e.value)


def _cache_copy(built_cache, tmp_path):
    """(config, cache folder) of a private copy of the built cache, under tmp_path/cache, that a test may damage."""
    cfg = config.load_config(built_cache)
    cache_dir = tmp_path / "cache"
    shutil.copytree(config.cache_dir(cfg), cache_dir)
    return dict(cfg, cache=dict(cfg["cache"], dir=str(tmp_path)), name="cache"), cache_dir


def _index(cfg, tmp_path):
    """The index build_index writes from `cfg`'s shards, as a dict."""
    cache.build_index(cfg, cache.shard_paths(cfg), tmp_path / "index.json", log=lambda *_: None)
    return json.loads((tmp_path / "index.json").read_text())


def test_index_refuses_statistics_that_are_not_finite(built_cache, tmp_path):
    # a shard built before load_clip refused audio beyond full scale could hold a clip's infinite
    # mel sums: the index averaged them into every clip's normalisation (index.json said Infinity)
    cfg, cache_dir = _cache_copy(built_cache, tmp_path)
    prefix = shards.prefix(cache_dir, "mels", 1)
    stats_path = prefix.with_suffix(".stats.npy")
    stats = np.load(stats_path)
    stats[2] = np.inf
    np.save(stats_path, stats)
    meta = json.loads(prefix.with_suffix(".json").read_text())
    # as its job wrote them: the JSON vouches for these bytes
    prefix.with_suffix(".json").write_text(json.dumps(dict(meta, stats_checksum=shards.checksum(stats_path.read_bytes()))))
    with pytest.raises(PipelineError, match=re.escape(f"{stats_path}: clip {meta['ids'][2]!r} has non-finite mels statistics")):
        _index(cfg, tmp_path)
    assert not (tmp_path / "index.json").exists()


def _flip_a_bit_keeping_it_finite(path, row):
    """Flip the lowest bit of row `row`'s first value in a .stats.npy (float64, little-endian: its
    mantissa's last bit), its mtime kept: the same shape, finite, a sum that is no longer its clip's."""
    st, before = path.stat(), np.load(path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) - before.nbytes + row * before[0].nbytes] ^= 0x01
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = np.load(path)
    assert after.shape == before.shape and np.isfinite(after).all() and np.count_nonzero(after != before) == 1


@pytest.mark.parametrize("kind", ["mels", "energy", "pitch"])
def test_index_refuses_a_stats_file_changed_after_its_job_wrote_it(built_cache, tmp_path, kind):
    # a flipped bit in a clip's sums passed: the index's mean and std (which training and every
    # checkpoint carry) came out of them, off, without a word
    cfg, cache_dir = _cache_copy(built_cache, tmp_path)
    built = json.loads((cache_dir / "index.json").read_text())
    index = _index(cfg, tmp_path)  # an intact cache: the statistics the cache's own job computed
    assert (index["mel_mean"], index["pitch_mean"], index["energy_std"]) == \
        (built["mel_mean"], built["pitch_mean"], built["energy_std"])
    (tmp_path / "index.json").unlink()
    stats_path = shards.prefix(cache_dir, kind, 1).with_suffix(".stats.npy")
    _flip_a_bit_keeping_it_finite(stats_path, 0)
    with pytest.raises(shards.CacheError) as e:
        _index(cfg, tmp_path)
    assert str(e.value) == (f"{stats_path}: damaged (checksum mismatch: the file changed after its job wrote it); "
                            "delete it and run `snakemake --cores all caches` (it rebuilds a shard whose files are missing)")
    assert not (tmp_path / "index.json").exists()


def test_a_shard_written_before_its_sums_checksum_was_recorded_is_still_read(built_cache, tmp_path):
    # caches built before each .stats.npy's checksum went into its shard's JSON: their sums are read as
    # they were then, not refused and not rebuilt (the index, the aligner and the runs trained on them stay)
    cfg, cache_dir = _cache_copy(built_cache, tmp_path)
    built = json.loads((cache_dir / "index.json").read_text())
    for kind in ("mels", "energy", "pitch"):
        prefix = shards.prefix(cache_dir, kind, 2)
        meta = json.loads(prefix.with_suffix(".json").read_text())
        assert meta["stats_checksum"] == shards.checksum(prefix.with_suffix(".stats.npy").read_bytes())
        prefix.with_suffix(".json").write_text(json.dumps({k: v for k, v in meta.items() if k != "stats_checksum"}))
    index = _index(cfg, tmp_path)
    assert (index["mel_mean"], index["pitch_mean"], index["energy_std"]) == \
        (built["mel_mean"], built["pitch_mean"], built["energy_std"])


def test_truncated_flac_is_rejected(tmp_path, corpus_template):
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = sf.read(str(good), dtype="float32")[0]
    sf.write(str(tmp_path / "whole.flac"), y, SR, subtype="PCM_16")
    data = (tmp_path / "whole.flac").read_bytes()
    (tmp_path / "cut.flac").write_bytes(data[:len(data) // 2])
    with pytest.raises(audio.BadAudio):
        audio.load_audio(tmp_path / "cut.flac", sample_rate=SR, max_seconds=20.0)
    assert len(audio.load_audio(tmp_path / "whole.flac", sample_rate=SR, max_seconds=20.0)) == len(y)


@pytest.mark.parametrize("subtype, rate", [("VORBIS", SR), ("OPUS", 48000)])
def test_truncated_ogg_is_rejected(tmp_path, corpus_template, subtype, rate):
    # libsndfile decodes a half-copied .ogg as a shorter clip, silently: half the audio under the whole text
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = soxr.resample(sf.read(str(good), dtype="float32")[0], SR, rate)
    sf.write(str(tmp_path / "whole.ogg"), y, rate, format="OGG", subtype=subtype)
    data = (tmp_path / "whole.ogg").read_bytes()
    whole = cache.load_clip(tmp_path / "whole.ogg", sample_rate=SR, max_seconds=20.0)
    for fraction in (0.5, 0.9, 0.995):
        cut = data[:int(len(data) * fraction)]
        for padding in (b"", bytes(4096 - len(cut) % 4096)):  # a copy tool's zero padding: the cut page fits
            (tmp_path / "cut.ogg").write_bytes(cut + padding)
            assert 0 < sf.info(str(tmp_path / "cut.ogg")).frames  # what libsndfile would have kept
            with pytest.raises(audio.BadAudio, match="truncated .its last Ogg page"):
                cache.load_clip(tmp_path / "cut.ogg", sample_rate=SR, max_seconds=20.0)
    assert abs(len(whole) - len(sf.read(str(good))[0])) <= SR // 100
    # a whole file with bytes after its last page that start no page (an ID3v1 tag, a copy tool's zero
    # padding) is not cut short
    for extra in (b"TAG" + bytes(125), bytes(4096 - len(data) % 4096)):
        (tmp_path / "tagged.ogg").write_bytes(data + extra)
        assert len(cache.load_clip(tmp_path / "tagged.ogg", sample_rate=SR, max_seconds=20.0)) == len(whole)


def test_streamed_wav_with_placeholder_sizes_is_read(tmp_path, corpus_template):
    # a WAV written to a pipe (sox -, ffmpeg pipe:) has 0xFFFFFFFF size fields: not truncated
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = sf.read(str(good), dtype="int16")[0]
    header = (b"RIFF" + (0xFFFFFFFF).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
              + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + SR.to_bytes(4, "little")
              + (2 * SR).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
              + b"data" + (0xFFFFFFFF).to_bytes(4, "little"))
    (tmp_path / "streamed.wav").write_bytes(header + y.astype("<i2").tobytes())
    got = audio.load_audio(tmp_path / "streamed.wav", sample_rate=SR, max_seconds=20.0)
    np.testing.assert_allclose(got, y / 32768.0, atol=1e-6)


def _spoken_into_a_pipe(path):
    """What `espeak-ng --stdout` writes (a WAV with a placeholder data size), saved at `path`; its bytes."""
    spoken = subprocess.run(["espeak-ng", "--stdout", "A sentence spoken into a pipe."], capture_output=True,
                            check=True).stdout
    Path(path).write_bytes(spoken)
    return spoken


def test_streamed_wav_decoded_by_a_killed_job_leaves_nothing_in_tmpdir(tmp_path, monkeypatch):
    # the placeholder-size copy was a NamedTemporaryFile: a mel job killed while reading it (SIGKILL, a
    # SLURM time limit: no exit handler runs) left the clip's bytes in $TMPDIR
    _spoken_into_a_pipe(tmp_path / "piped.wav")
    assert cache.streamed_wav(tmp_path / "piped.wav") is not None
    assert left_in_tmpdir(tmp_path, f"""
from pipeline import audio, cache
def killed(path, **kw):
    assert len(audio.load_audio.__wrapped__(path, **kw)) > 0
    import os; os._exit(0)
killed.__wrapped__ = audio.load_audio
audio.load_audio = killed
cache.decode({str(tmp_path / "piped.wav")!r}, sample_rate=22050, max_seconds=20.0)
""") == []
    # where the system has no memory files (no such call, or a kernel that refuses it): a temporary
    # file, removed once read
    want = cache.decode(tmp_path / "piped.wav", sample_rate=SR, max_seconds=20.0)
    monkeypatch.setattr(cache.tempfile, "tempdir", str(tmp_path / "tmp"))

    def refused(*args):
        raise OSError(errno.ENOSYS, "Function not implemented")
    for patch in (lambda: monkeypatch.setattr(cache.os, "memfd_create", refused),
                  lambda: monkeypatch.delattr(cache.os, "memfd_create")):
        patch()
        np.testing.assert_array_equal(cache.decode(tmp_path / "piped.wav", sample_rate=SR, max_seconds=20.0), want)
        assert list((tmp_path / "tmp").iterdir()) == []


def test_wav_streamed_with_a_2gb_placeholder_is_read_to_its_end(tmp_path, corpus_template):
    # espeak-ng --stdout writes a data size of 0x7FFFF000, arecord 0x7FFFFFFF: every such clip was refused as
    # "truncated (the WAV header declares 2147417336 more bytes ...)" though libsndfile reads it whole
    spoken = _spoken_into_a_pipe(tmp_path / "piped.wav")
    assert int.from_bytes(spoken[40:44], "little") == 0x7FFFF000  # its placeholder, after a 16-byte fmt chunk
    got = cache.load_clip(tmp_path / "piped.wav", sample_rate=SR, max_seconds=20.0)
    np.testing.assert_array_equal(got, sf.read(str(tmp_path / "piped.wav"), dtype="float32")[0])
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = sf.read(str(good), dtype="int16")[0]
    sf.write(str(tmp_path / "whole.wav"), y, SR, subtype="PCM_16")
    raw = (tmp_path / "whole.wav").read_bytes()
    at = raw.index(b"data") + 4
    (tmp_path / "arecord.wav").write_bytes(raw[:at] + (0x7FFFFFFF).to_bytes(4, "little") + raw[at + 4:])
    np.testing.assert_array_equal(cache.decode(tmp_path / "arecord.wav", sample_rate=SR, max_seconds=20.0),
                                  y / np.float32(32768))
    # a torn copy of a real clip declares what it lost: still truncated
    (tmp_path / "torn.wav").write_bytes(raw[:len(raw) // 2])
    with pytest.raises(audio.BadAudio, match="truncated .the WAV header declares"):
        cache.load_clip(tmp_path / "torn.wav", sample_rate=SR, max_seconds=20.0)


def test_wav_declaring_less_audio_than_it_holds_is_refused(tmp_path, corpus_template):
    # libsndfile reads only the declared part: a 0 size was "empty (no samples)", half a size half the clip
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = sf.read(str(good), dtype="int16")[0]
    sf.write(str(tmp_path / "whole.wav"), y, SR, subtype="PCM_16")
    raw = (tmp_path / "whole.wav").read_bytes()
    at = raw.index(b"data") + 4
    size = int.from_bytes(raw[at:at + 4], "little")
    for declared, match in ((0, "declares no audio .a data size of 0"),
                            (size // 2, f"declares {size // 2} bytes of audio, and {size - size // 2} bytes")):
        (tmp_path / "short.wav").write_bytes(raw[:at] + declared.to_bytes(4, "little") + raw[at + 4:])
        assert sf.info(str(tmp_path / "short.wav")).frames == declared // 2  # what libsndfile would keep
        with pytest.raises(audio.BadAudio, match=match):
            cache.load_clip(tmp_path / "short.wav", sample_rate=SR, max_seconds=20.0)
    # WAVE_FORMAT_EXTENSIBLE (ffmpeg's and sox's 24-bit or multichannel WAVs), which libsndfile calls WAVEX
    sf.write(str(tmp_path / "wavex.wav"), y, SR, subtype="PCM_24", format="WAVEX")
    wavex = (tmp_path / "wavex.wav").read_bytes()
    at_x = wavex.index(b"data") + 4
    half = int.from_bytes(wavex[at_x:at_x + 4], "little") // 2 // 3 * 3
    (tmp_path / "short.wav").write_bytes(wavex[:at_x] + half.to_bytes(4, "little") + wavex[at_x + 4:])
    assert sf.info(str(tmp_path / "short.wav")).format == "WAVEX"
    with pytest.raises(audio.BadAudio, match=f"declares {half} bytes of audio"):
        cache.load_clip(tmp_path / "short.wav", sample_rate=SR, max_seconds=20.0)
    # what may follow a WAV's data: whole chunks (an odd one without its pad byte), an ID3v1 tag, zeros, an
    # ID3v2 tag a tagger appended, a stray byte or two (less than 10 ms of audio)
    id3v2 = b"ID3\x03\x00\x00" + (300).to_bytes(4, "big") + b"\x01" * 300
    for extra in (b"LIST" + (5).to_bytes(4, "little") + b"INFOa", b"TAG" + bytes(125), bytes(3000), id3v2,
                  b"LIST" + (4).to_bytes(4, "little") + b"INFO" + b"\x07"):
        (tmp_path / "extra.wav").write_bytes(raw + extra)
        assert len(cache.load_clip(tmp_path / "extra.wav", sample_rate=SR, max_seconds=20.0)) == len(y)
    # no samples, then only whole chunks: empty, as before
    (tmp_path / "empty.wav").write_bytes(raw[:at] + bytes(4) + b"LIST" + (4).to_bytes(4, "little") + b"INFO")
    with pytest.raises(audio.BadAudio, match="^empty"):
        cache.load_clip(tmp_path / "empty.wav", sample_rate=SR, max_seconds=20.0)


@pytest.mark.parametrize("rate", [SR, 16000])
def test_mp3_cut_short_is_refused(tmp_path, corpus_template, rate):
    # libsndfile decodes a half-copied MP3 as a shorter clip, silently, though its Xing header says more
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = soxr.resample(sf.read(str(good), dtype="float32")[0], SR, rate)
    sf.write(str(tmp_path / "whole.mp3"), y, rate, format="MP3")
    data = (tmp_path / "whole.mp3").read_bytes()
    id3 = b"ID3\x03\x00\x00" + (20).to_bytes(4, "big") + bytes(20)  # an ID3v2 tag before the first frame
    for head in (b"", id3):
        (tmp_path / "tagged.mp3").write_bytes(head + data)
        info = sf.info(str(tmp_path / "tagged.mp3"))
        assert cache.mp3_declared_samples(tmp_path / "tagged.mp3", info) == (info.frames, 576)  # MPEG-2: 576 a frame
        whole = cache.load_clip(tmp_path / "tagged.mp3", sample_rate=SR, max_seconds=20.0)
        assert abs(len(whole) - len(y) * SR / rate) <= SR // 100
        for fraction in (0.5, 0.95):
            (tmp_path / "cut.mp3").write_bytes(head + data[:int(len(data) * fraction)])
            assert sf.info(str(tmp_path / "cut.mp3")).frames == sf.info(str(tmp_path / "whole.mp3")).frames
            with pytest.raises(audio.BadAudio, match=r"truncated \(its header declares .* s, it decodes to"):
                cache.load_clip(tmp_path / "cut.mp3", sample_rate=SR, max_seconds=20.0)
    (tmp_path / "noise.mp3").write_bytes(b"\xff\xfb\x90\x64" + bytes(400))  # a first frame without one
    assert cache.mp3_declared_samples(tmp_path / "noise.mp3", None) is None
    tag = data.index(b"Xing") if b"Xing" in data[:200] else data.index(b"Info")
    (tmp_path / "uncounted.mp3").write_bytes(data[:tag + 4] + bytes(4) + data[tag + 8:])  # no frame-count flag
    assert cache.mp3_declared_samples(tmp_path / "uncounted.mp3", None) is None
    # A VBRI header (Fraunhofer's), which mpg123 does not read: libsndfile stops at its estimate from the
    # size and the first frame's bitrate. At 64 kbps that is half an intact VBR file's audio, kept silently
    # before; at 24 kbps it overestimates, and the whole file is kept.
    vbr = tmp_path / "vbr.mp3"
    sf.write(str(vbr), y, rate, format="MP3", bitrate_mode="VARIABLE", compression_level=0.9)
    raw = vbr.read_bytes()
    header = int.from_bytes(raw[:4], "big")
    kbps = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160][(header >> 12) & 0xF]
    frames = int.from_bytes(raw[raw.index(b"Xing") + 8:][:4], "big")
    music = raw[72 * kbps * 1000 // rate + ((header >> 9) & 1):]   # the frames after the Xing frame (MPEG-2)
    decoded = len(sf.read(str(vbr))[0])
    for kbps, index in ((64, 8), (24, 3)):
        size = 72 * kbps * 1000 // rate
        first = ((header & ~(0xF << 12) & ~(1 << 9)) | (index << 12)).to_bytes(4, "big") + bytes(32) + b"VBRI" \
            + struct.pack(">HHHII", 1, 1105, 75, len(music) + size, frames) + struct.pack(">HHHH", 0, 1, 2, 1)
        (tmp_path / "vbri.mp3").write_bytes(first + bytes(size - len(first)) + music)
        assert cache.mp3_declared_samples(tmp_path / "vbri.mp3", None) == (frames * 576, 576)
        got = len(sf.read(str(tmp_path / "vbri.mp3"))[0])
        if kbps == 64:
            assert got < decoded * 0.9  # what libsndfile keeps of it
            with pytest.raises(audio.BadAudio, match="or a VBR file libsndfile reads short"):
                cache.load_clip(tmp_path / "vbri.mp3", sample_rate=SR, max_seconds=20.0)
        else:
            assert got >= decoded - 1152
            assert abs(len(cache.load_clip(tmp_path / "vbri.mp3", sample_rate=SR, max_seconds=20.0))
                       - got * SR / rate) <= SR // 100



def test_mp3_frame_length():
    assert cache.mp3_frame_length(0xFFFB90C4) == 417  # MPEG-1, 128 kbps, 44,100 Hz
    assert cache.mp3_frame_length(0xFFFB92C4) == 418  # padded
    assert cache.mp3_frame_length(0xFFF390C4) == 261  # MPEG-2, 80 kbps, 22,050 Hz
    assert cache.mp3_frame_length(0xFFE348C4) == 288  # MPEG-2.5, 32 kbps, 8,000 Hz
    # not a frame whose length it says: free format, a bad bitrate, a reserved version, rate or emphasis, Layer II
    for header in (0xFFFB00C4, 0xFFFBF0C4, 0xFFEB90C4, 0xFFFB9CC4, 0xFFFB90C6, 0xFFFD90C4, 0x54414700):
        assert cache.mp3_frame_length(header) is None


@pytest.mark.parametrize("rate", [SR, 44100, 8000])
def test_mp3_without_header_cut_short_is_refused(tmp_path, corpus_template, rate):
    # A CBR MP3 without a Xing, Info or VBRI header (its Info frame dropped) declares no length: libsndfile
    # decodes a half-copied one as a shorter clip, silently. Its last frame, cut short, gives it away.
    good = sorted((corpus_template / "wavs").glob("*.wav"))[2]
    y = soxr.resample(sf.read(str(good), dtype="float32")[0], SR, rate)
    sf.write(str(tmp_path / "cbr.mp3"), y, rate, format="MP3", bitrate_mode="CONSTANT", compression_level=0.5)
    data = (tmp_path / "cbr.mp3").read_bytes()
    assert b"Info" in data[:200]
    bare = data[cache.mp3_frame_length(int.from_bytes(data[:4], "big")):]
    assert cache.mp3_frame_length(int.from_bytes(bare[:4], "big")) and b"Info" not in bare[:200]
    (tmp_path / "bare.mp3").write_bytes(bare)
    assert cache.mp3_declared_samples(tmp_path / "bare.mp3", None) is None
    whole = cache.load_clip(tmp_path / "bare.mp3", sample_rate=SR, max_seconds=20.0)
    assert 0 <= len(whole) - len(y) * SR / rate <= SR // 4  # with the encoder's delay and padding, untrimmed
    at = 0  # the start of a frame near the middle
    while at < len(bare) // 2:
        at += cache.mp3_frame_length(int.from_bytes(bare[at:at + 4], "big"))
    size = cache.mp3_frame_length(int.from_bytes(bare[at:at + 4], "big"))
    id3 = b"ID3\x03\x00\x00" + (20).to_bytes(4, "big") + bytes(20)  # an ID3v2 tag before the first frame
    for head, cut in [(b"", at + n) for n in (2, 3, 4, 5, 100, size - 1)] + [(id3, at + 7), (b"", len(bare) - 1)]:
        (tmp_path / "cut.mp3").write_bytes(head + bare[:cut])
        assert len(sf.read(str(tmp_path / "cut.mp3"))[0]) < len(sf.read(str(tmp_path / "bare.mp3"))[0])
        with pytest.raises(audio.BadAudio, match=r"^truncated \(its last MP3 frame is cut short \(.*: a half-copied"):
            cache.load_clip(tmp_path / "cut.mp3", sample_rate=SR, max_seconds=20.0)
    # cut between two frames: a whole, shorter file (nothing tells them apart); what may follow the last
    # frame: an ID3v1 tag, an APEv2 tag, zero padding (under 1024 bytes: mpg123 gives up on more)
    (tmp_path / "even.mp3").write_bytes(bare[:at])
    assert len(whole) * 0.4 < len(cache.load_clip(tmp_path / "even.mp3", sample_rate=SR, max_seconds=20.0)) \
        < len(whole) * 0.6
    for extra in (b"TAG" + bytes(125), b"APETAGEX" + bytes(24), bytes(1000)):
        (tmp_path / "extra.mp3").write_bytes(id3 + bare + extra)
        assert cache.mp3_cut_frame(tmp_path / "extra.mp3") is None
        assert len(cache.load_clip(tmp_path / "extra.mp3", sample_rate=SR, max_seconds=20.0)) == len(whole)

# --- other rates, depths, channels, containers -----------------------------------------------
def _close(mel, ref):
    """Frames within 1, and the same picture where there is speech (log-mel above 1e-2)."""
    assert abs(len(mel) - len(ref)) <= 1
    n = min(len(mel), len(ref))
    loud = ref[:n] > np.log(1e-2)
    return float(np.abs(mel[:n] - ref[:n])[loud].mean())


def test_other_formats_give_the_same_mel(tmp_path, corpus_template):
    wavs = sorted((corpus_template / "wavs").glob("*.wav"))
    y, sr = sf.read(str(wavs[2]), dtype="float32")
    assert sr == SR
    a = config.load_config(None, check_paths=False)["audio"]
    ref = audio.mel_spectrogram(y, **a)

    y44 = soxr.resample(y, SR, 44100)
    sf.write(str(tmp_path / "a.flac"), np.stack([y44, y44], axis=1), 44100, subtype="PCM_24")
    sf.write(str(tmp_path / "b.ogg"), soxr.resample(y, SR, 16000), 16000, format="OGG", subtype="VORBIS")
    sf.write(str(tmp_path / "c.wav"), y, SR, subtype="PCM_U8")
    sf.write(str(tmp_path / "d.wav"), np.stack([y, y], axis=1), SR, subtype="PCM_32")
    expected = {"a.flac": (2, 44100, "PCM_24"), "b.ogg": (1, 16000, "VORBIS"), "c.wav": (1, SR, "PCM_U8"),
                "d.wav": (2, SR, "PCM_32")}
    errors = {}
    for name, (channels, rate, subtype) in expected.items():
        info = sf.info(str(tmp_path / name))
        assert (info.channels, info.samplerate, info.subtype) == (channels, rate, subtype)
        mel = audio.mel_from_file(tmp_path / name, a, max_seconds=20.0)
        assert mel.shape[1] == N_MELS
        errors[name] = _close(mel, ref)
    # a different sentence is far away by the same measure, so the bound below means something
    other = audio.mel_from_file(wavs[5], a, max_seconds=20.0)
    m = min(len(other), len(ref))
    far = float(np.abs(other[:m] - ref[:m])[ref[:m] > np.log(1e-2)].mean())
    assert far > 1.0
    assert max(errors.values()) < 0.2, errors
    assert errors["a.flac"] < 0.05 and errors["d.wav"] < 0.01, errors  # lossless: resampling only


@pytest.mark.parametrize("edit", [{"audio": {"hop_length": 200}}, {"dataset": {"max_seconds": 15.0}}])
def test_pitch_job_decodes_the_clips_itself_after_a_hop_or_max_seconds_edit(built_cache, tmp_path, edit):
    # the audio shard holds waveforms cut to the old frame grid (or kept under the old max_seconds): a
    # pitch job run before the mel job rewrites it must not read them
    cfg = config.load_config(built_cache)
    audio_shard = shards.prefix(config.cache_dir(cfg), "audio", 1)
    said = []
    cache.build_pitch_shard(config.load_config(built_cache, edit), 1, tmp_path / "pitch", audio_shard=audio_shard,
                            log=said.append)
    assert any("is not of these clips' files or settings: decoding them" in line for line in said), said


def test_pitch_job_decodes_a_replaced_clip_itself(corpus, tmp_path):
    root, cfg_path = corpus
    cfg = config.load_config(cfg_path)
    cache_dir, quiet = config.cache_dir(cfg), (lambda *a: None)
    audio_shard = shards.prefix(cache_dir, "audio", 1)
    cache.build_mel_shard(cfg, 1, shards.prefix(cache_dir, "mels", 1), shards.prefix(cache_dir, "energy", 1),
                          audio_shard, log=quiet)
    ids = shards.read_meta(audio_shard, "audio")["ids"]
    other = next(c.stem for c in sorted((root / "wavs").glob("*.wav")) if c.stem not in ids)
    shutil.copy(root / "wavs" / f"{other}.wav", root / "wavs" / f"{ids[0]}.wav")  # a re-recorded clip
    said = []
    cache.build_pitch_shard(cfg, 1, shards.prefix(cache_dir, "pitch", 1), audio_shard, log=said.append)
    assert any("is not of these clips' files or settings: decoding them" in line for line in said), said


def test_index_refuses_shards_of_other_settings(built_cache, tmp_path):
    cfg = config.load_config(built_cache, {"text": {"cleaners": "basic"}})
    with pytest.raises(shards.CacheError, match=r"tokens/shard-000.*other settings"):
        cache.build_index(cfg, cache.shard_paths(cfg), tmp_path / "index.json", log=lambda *_: None)
    assert not (tmp_path / "index.json").exists()


def test_a_clip_with_one_mel_frame_a_token_is_not_too_short():
    metas = {"tokens": {"ids": ["a", "b"], "lengths": [10, 10]}, "mels": {"ids": ["a", "b"], "lengths": [10, 9]}}
    assert cache._short_clips(metas, {"a", "b"}) == {
        "b": "9 mel frames for 10 tokens: the audio is too short for its text"}


def test_a_shard_number_out_of_range_is_one_line(corpus, tmp_path, capsys):
    _, cfg_path = corpus
    for shard in ("4", "-1"):
        with pytest.raises(SystemExit) as e:
            cache.main(["tokens", "--config", str(cfg_path), "--shard", shard, "--out", str(tmp_path / "x")])
        err = capsys.readouterr().err
        assert e.value.code != 0 and err.startswith("error: --shard must be in 0..3") and err.count("\n") == 1
    assert not list(tmp_path.glob("x.*"))


def test_a_float_file_beyond_full_scale_is_not_counted_clipped(tmp_path, corpus_template):
    # samples above 1.0 in a float file are no integer file's flattened peaks (MAX_PEAK refuses 2.0 and more)
    y = sf.read(str(sorted((corpus_template / "wavs").glob("*.wav"))[2]), dtype="float32")[0]
    loud = np.tanh(8 * y / np.abs(y).max())  # compressed speech, then scaled to a peak of 1.5: ~10 % of it above 1.0
    loud = (loud - loud.mean()) / np.abs(loud - loud.mean()).max() * 1.5
    sf.write(str(tmp_path / "loud.wav"), loud, SR, subtype="FLOAT")
    assert len(cache.load_clip(tmp_path / "loud.wav", sample_rate=SR, max_seconds=20.0)) == len(y)
