"""Tests for pipeline/make_corpus.py: speak 3 LJSpeech lines with espeak-ng into tmp_path."""
import errno
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf

from pipeline import make_corpus as mc

ROOT = Path(__file__).resolve().parent.parent
TRANSCRIPTS = ROOT / "data" / "ljspeech_transcripts.csv"

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng is not installed (apt-get install espeak-ng)")


def _lines(n):
    return TRANSCRIPTS.read_text(encoding="utf-8").splitlines()[:n]


def refused(capsys, argv):
    """The command's refusal: status 2 and one `error:` line on stderr, which it returns."""
    with pytest.raises(SystemExit) as exit_:
        mc.main(argv)
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: "), line
    return line


def test_corpus_of_three_clips(tmp_path):
    stats = mc.make_corpus(TRANSCRIPTS, tmp_path, count=3, jobs=2, sample_rate=16000)
    assert stats["clips"] == stats["made"] == 3 and stats["skipped"] == 0

    raw = (tmp_path / "metadata.csv").read_bytes()
    assert b"\r" not in raw
    assert raw.decode("utf-8").splitlines() == _lines(3)
    total = 0.0
    for line in _lines(3):
        path = tmp_path / "wavs" / f"{line.split('|')[0]}.flac"
        info = sf.info(path)
        assert (info.format, info.subtype, info.channels, info.samplerate) == \
            ("FLAC", "PCM_16", 1, 16000)
        audio, sr = sf.read(path, dtype="float32")
        assert audio.shape == (info.frames,) and np.abs(audio).max() > 0.05
        assert len(audio) / sr > 0.5
        total += len(audio) / sr
    assert stats["seconds"] == pytest.approx(total, abs=0.05)
    assert not list((tmp_path / "wavs").glob(".*"))  # no temporary files left

    # a rerun makes nothing, a changed request remakes only what changed
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wavs").iterdir()}
    assert mc.make_corpus(TRANSCRIPTS, tmp_path, count=3, jobs=2, sample_rate=16000)["made"] == 0
    assert before == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wavs").iterdir()}
    # a file it cannot read carries no tag: it might be the user's, so it is refused, not replaced
    (tmp_path / "wavs" / "LJ001-0002.flac").write_bytes(b"torn copy")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'wavs' / 'LJ001-0002.flac'}: not made by make_corpus")):
        mc.make_corpus(TRANSCRIPTS, tmp_path, count=3, sample_rate=16000)
    (tmp_path / "wavs" / "LJ001-0002.flac").unlink()
    assert mc.make_corpus(TRANSCRIPTS, tmp_path, count=3, sample_rate=16000)["made"] == 1
    assert mc.make_corpus(TRANSCRIPTS, tmp_path, count=3, sample_rate=16000, speed=200)["made"] == 3


def test_wav_at_espeak_rate_via_cli(tmp_path):
    mc.main(["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path), "--count", "1",
             "--start", "1", "--format", "wav", "--jobs", "1"])
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8") == _lines(2)[1] + "\n"
    info = sf.info(tmp_path / "wavs" / "LJ001-0002.wav")
    assert (info.format, info.subtype, info.samplerate) == ("WAV", "PCM_16", 22050)


def test_speak_is_safe_with_quotes_and_dashes():
    audio, sr = mc.speak('-- "Yes," he said; it\'s -v done.', voice="en-us", speed=175)
    assert sr == mc.ESPEAK_RATE and audio.dtype == np.float32
    assert len(audio) / sr > 1.0 and 0.05 < np.abs(audio).max() <= 1.0


def test_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="lines from line 13099, not 3"):
        mc.make_corpus(TRANSCRIPTS, tmp_path, count=3, start=13099)
    with pytest.raises(RuntimeError, match="voice"):
        mc.make_corpus(TRANSCRIPTS, tmp_path, count=1, voice="notavoice")
    assert not (tmp_path / "metadata.csv").exists()
    monkeypatch.setattr(mc, "ESPEAK", "espeak-ng-not-installed")
    with pytest.raises(RuntimeError, match="apt-get install espeak-ng"):
        mc.make_corpus(TRANSCRIPTS, tmp_path, count=1)
    with pytest.raises(RuntimeError, match="apt-get install espeak-ng"):
        mc.speak("hello")


@pytest.mark.parametrize("option, value, said", [
    ("--speed", "0", "--speed 0: 80 to 5000 words a minute"),     # espeak-ng spoke it at 175, silently
    ("--speed", "99999", "--speed 99999: 80 to 5000"),              # "produced no audio for 'Second line.'"
    ("--sample-rate", "2000000000", "--sample-rate 2000000000: 8000 to 192000 Hz"),  # a 4 GB wav of 1 s
    ("--compression-level", "nan", "--compression-level nan: 0 to 1"),  # named a transcript line
    ("--jobs", "100000", "--jobs 100000: 1 to 256"),   # a thread and an espeak-ng each: 13,100 at once
])
def test_numbers_espeak_or_the_files_cannot_honour_are_refused_naming_the_option(tmp_path, capsys, option, value,
                                                                                 said):
    for voices in ([], ["--voices", "en-us,en-us+f2"]):
        line = refused(capsys, ["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / "c"), "--count", "1",
                                option, value, *voices])
        assert line == f"error: {said}" or line.startswith(f"error: {said}"), line
    assert not (tmp_path / "c").exists()


def test_a_compression_level_for_wav_clips_is_refused_naming_the_option(tmp_path, capsys):
    # libsndfile refused it after the first clip was spoken: "t.csv:1: clip LJ001-0001: Error set
    # compression level 0.5(Garbled error message from libsndfile)", blaming a transcript line
    for voices in ([], ["--voices", "en-us,en-us+f2"]):
        line = refused(capsys, ["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / "c"), "--count", "1",
                                "--format", "wav", "--compression-level", "0.5", *voices])
        assert line.startswith("error: --compression-level 0.5: FLAC only"), line
    assert not (tmp_path / "c").exists()


def test_a_voices_corpus_takes_the_compression_level(tmp_path, capsys):
    # --voices dropped --compression-level, silently: every FLAC at libsndfile's default
    sizes = []
    for level in ("0", "1"):
        mc.main(["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / level), "--count", "1", "--voices",
                 "en-us", "--compression-level", level, "--jobs", "1"])
        sizes.append((tmp_path / level / "wavs" / "en-us-LJ001-0001.flac").stat().st_size)
    assert sizes[0] > sizes[1], sizes


def test_voices_corpus_in_the_csv_format(tmp_path):
    from pipeline import formats

    stats = mc.make_voices_corpus(TRANSCRIPTS, tmp_path, voices=["en-us+m3", "en-gb+f2"], languages=None,
                                  count=2, jobs=2, sample_rate=16000)
    assert stats["clips"] == 4 and stats["speakers"] == ["en-us+m3", "en-gb+f2"]
    clips = formats.read_sources([{"root": str(tmp_path), "format": "csv", "name": "v"}])
    assert [(c.speaker, c.language) for c in clips] == [("en-us+m3", "en-us")] * 2 + [("en-gb+f2", "en-gb")] * 2
    texts = [c.text for c in clips]
    assert len(set(texts)) == 4  # different sentences per speaker
    assert texts == [line.split("|")[-1] for line in _lines(4)]
    a, _ = sf.read(tmp_path / "wavs" / "en-us_m3-LJ001-0001.flac")
    b, _ = sf.read(clips[2].audio)
    assert len(a) > 8000 and len(b) > 8000
    with pytest.raises(ValueError, match="one language each"):
        mc.make_voices_corpus(TRANSCRIPTS, tmp_path, voices=["en-us", "de"], languages=["en-us"], count=1)


def test_voices_named_by_their_espeak_file_make_a_corpus_planning_takes(tmp_path):
    # `espeak-ng --voices` lists files such as gmw/en-US: a file stem with "/" made a folder in wavs/, and
    # the speaker "gmw/en-US" and language "gmw/en-US" were refused when the pipeline read the corpus
    from pipeline import formats

    stats = mc.make_voices_corpus(TRANSCRIPTS, tmp_path, voices=["gmw/en-US", "en-us+f2"], count=1,
                                  sample_rate=16000)
    assert stats["speakers"] == ["gmw_en-US", "en-us+f2"]
    assert sorted(p.name for p in (tmp_path / "wavs").iterdir()) == ["en-us_f2-LJ001-0002.flac",
                                                                     "gmw_en-US-LJ001-0001.flac"]
    clips = formats.read_sources([{"root": str(tmp_path), "format": "csv"}])
    assert [(c.speaker, c.language) for c in clips] == [("gmw_en-US", "en-us"), ("en-us+f2", "en-us")]
    formats.check_languages(clips, set(), "en-us")  # what planning checks
    with pytest.raises(ValueError, match="--voices en: espeak-ng has no language 'en' for the token job"):
        mc.make_voices_corpus(TRANSCRIPTS, tmp_path / "x", voices=["en"], count=1)
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv, message", [
    (["--voices", "en-us+m3,en-us+M3"], "--voices en-us+M3: espeak-ng has no variant 'M3'"),
    (["--voices", "en-us,en-us+f9"], "--voices en-us+f9: espeak-ng has no variant 'f9'"),
    (["--voices", "en-us+m3|x"], "--voices en-us+m3|x: espeak-ng has no variant 'm3|x'"),
    (["--voice", "en-us+adam2"], "--voice en-us+adam2: espeak-ng has no variant 'adam2'"),
])
def test_a_variant_espeak_does_not_have_stops_before_speaking(tmp_path, capsys, argv, message):
    # espeak-ng speaks an unknown variant (en-us+M3: variant names are case-sensitive) as the plain voice,
    # silently: two --voices were one voice under two speaker names
    line = refused(capsys, ["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / "c"), "--count", "1", *argv])
    assert message in line, line
    assert "m3" in line or "f2" in line or "adam" in line, line  # what espeak-ng has instead
    assert not (tmp_path / "c").exists()


def test_a_voice_given_beside_voices_is_refused(tmp_path, capsys):
    # --voice en-gb --voices en-us+m3,en-us+f2 made the two en-us voices, dropping en-gb silently
    line = refused(capsys, ["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / "c"), "--count", "1",
                            "--voice", "en-gb", "--voices", "en-us+m3,en-us+f2"])
    assert line.startswith("error: --voice en-gb: not with --voices"), line
    line = refused(capsys, ["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / "c"), "--count", "1",
                            "--languages", "en-us"])
    assert line == "error: --languages goes with --voices", line
    assert not (tmp_path / "c").exists()


def test_variants_go_unchecked_where_espeak_lists_none(monkeypatch):
    # an espeak-ng whose --voices=variant lists no !v/ files would have had every variant refused
    monkeypatch.setattr(mc.subprocess, "run", lambda *a, **k: SimpleNamespace(stdout="Pty Language File\n"))
    mc.check_variants(["en-us+m3"], "--voices")


@pytest.mark.parametrize("first, second, message", [
    ("../../../escape|Hello world.", "D1|First line.", "t.csv:1: id '../../../escape' is not a plain file name"),
    ("D1|First line.", "D1|Second line.", "t.csv:2: duplicate id 'D1' (first on line 1)"),
    ("D1|First line.", ".hidden|Hello.", "t.csv:2: id '.hidden' is not a plain file name"),
    ("a\\b|Hello.", "D1|First line.", "t.csv:1: id 'a\\\\b' is not a plain file name"),
    ("a\x1bb|Hello.", "D1|First line.", "t.csv:1: id 'a\\x1bb' is not a plain file name"),
    ("D1|First line.", "D2|Stops\x00 here.", "t.csv:2: control character U+0000 at character 9"),
    # a first row of column names would be spoken as a clip "id" reading "normalized_text"
    ("id|text|normalized_text", "D1|First line.", "t.csv:1: 'id|text|normalized_text' is a header row"),
])
def test_an_id_that_is_no_plain_file_name_or_comes_twice_stops_before_speaking(tmp_path, capsys, first, second,
                                                                                  message):
    # ids name files under OUT/wavs: one reaching outside --out, or two lines writing one file, is refused
    (tmp_path / "t.csv").write_text(f"{first}\n{second}\n", encoding="utf-8")
    out = tmp_path / "a" / "b" / "corpus"
    line = refused(capsys, ["--transcripts", str(tmp_path / "t.csv"), "--out", str(out), "--count", "2",
                            "--format", "wav"])
    assert re.search(re.escape(message), line), line
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["t.csv"]  # nothing spoken, nothing written


def test_a_line_spoken_as_silence_stops_the_corpus_naming_its_line(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("A1|Hello there.\nP1|...\n", encoding="utf-8")
    line = refused(capsys, ["--transcripts", str(tmp_path / "t.csv"), "--out", str(tmp_path / "c"), "--count", "2",
                            "--format", "wav", "--jobs", "1"])
    assert re.search(r"t.csv:2: clip P1: espeak-ng spoke only silence for '...'", line), line
    assert not (tmp_path / "c" / "metadata.csv").exists() and not (tmp_path / "c" / "wavs" / "P1.wav").exists()
    with pytest.raises(ValueError, match="silence"):
        mc.speak("\u2014")  # an em dash alone
    # a voices corpus names the line and the voice
    with pytest.raises(RuntimeError, match=r"t.csv:2: clip P1 \(en-us\): espeak-ng spoke only silence"):
        mc.make_voices_corpus(tmp_path / "t.csv", tmp_path / "v", voices=["en-us"], count=2, sample_rate=16000)


def test_a_bom_and_blank_lines_read_as_the_pipeline_reads_them(tmp_path, capsys):
    # make_corpus refused files the pipeline's own reader takes; errors name the file's own line
    (tmp_path / "t.csv").write_bytes("\ufeffA1|Hello there.\n\nA2|Good morning.\r\n\n".encode("utf-8"))
    rows = mc.read_transcripts(tmp_path / "t.csv")
    assert [r[0] for r in rows] == ["A1", "A2"] and rows[1][2] == "A2|Good morning."
    assert [r[0] for r in mc.read_transcripts(tmp_path / "t.csv", start=1, count=1)] == ["A2"]
    (tmp_path / "t.csv").write_text("A1|Hello.\n\nA1|Hi.\n")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 't.csv'}:3: duplicate id 'A1' (first on line 1)")):
        mc.read_transcripts(tmp_path / "t.csv")
    (tmp_path / "t.csv").write_text("A1|Hello there.\n\n\nP1|...\n")
    line = refused(capsys, ["--transcripts", str(tmp_path / "t.csv"), "--out", str(tmp_path / "c"), "--count", "2",
                            "--format", "wav", "--jobs", "1"])
    assert re.search(r"t.csv:4: clip P1: espeak-ng spoke only silence", line), line


def test_ids_differing_only_in_case_are_refused_where_they_would_be_one_file(tmp_path, monkeypatch, capsys):
    # on macOS and Windows A1.wav and a1.wav are one file: the second clip overwrote the first's audio
    (tmp_path / "t.csv").write_text("A1|Hello there.\na1|Good morning.\n")
    assert not mc.case_insensitive(tmp_path)  # this machine: two files, both made
    assert mc.make_corpus(tmp_path / "t.csv", tmp_path / "linux", count=2, fmt="wav", jobs=1)["made"] == 2
    monkeypatch.setattr(mc, "case_insensitive", lambda folder: True)
    line = refused(capsys, ["--transcripts", str(tmp_path / "t.csv"), "--out", str(tmp_path / "mac"), "--count", "2",
                            "--format", "wav", "--jobs", "1"])
    assert re.search(re.escape(f"t.csv:2: clip 'a1' and 'A1' ({tmp_path / 't.csv'}:1) differ "
                                                   "only in case"), line), line
    assert not list((tmp_path / "mac" / "wavs").glob("*.wav"))  # refused before anything was spoken


def test_a_corpus_remade_in_another_format_keeps_no_old_clip(tmp_path):
    # the readers prefer .wav: a corpus remade in flac trained on the old wav clips
    mc.make_corpus(TRANSCRIPTS, tmp_path, count=2, fmt="wav", jobs=1)
    (tmp_path / "wavs" / "mine.wav").write_bytes(b"not make_corpus's")
    theirs = tmp_path / "wavs" / "LJ001-0002.ogg"
    sf.write(str(theirs), np.zeros(100, "float32") + 0.1, 22050, format="OGG")  # no make_corpus tag
    # another program's file in a clip's place, in a third format: refused before anything is spoken
    with pytest.raises(ValueError, match=re.escape(f"{theirs}: not made by make_corpus")):
        mc.make_corpus(TRANSCRIPTS, tmp_path, count=2, fmt="flac", jobs=1, sample_rate=16000)
    assert sorted(p.name for p in (tmp_path / "wavs").iterdir()) == [
        "LJ001-0001.wav", "LJ001-0002.ogg", "LJ001-0002.wav", "mine.wav"]
    theirs.unlink()
    stats = mc.make_corpus(TRANSCRIPTS, tmp_path, count=2, fmt="flac", jobs=1, sample_rate=16000)
    assert stats["made"] == 2
    assert sorted(p.name for p in (tmp_path / "wavs").iterdir()) == [
        "LJ001-0001.flac", "LJ001-0002.flac", "mine.wav"]  # a file in no clip's place stays


def checksums(folder):
    """{path under folder: sha256} of every file, to show a refused run changed nothing."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def _argv(out, count, *more):
    return ["--transcripts", str(TRANSCRIPTS), "--out", str(out), "--count", str(count), "--jobs", "2", *more]


def test_recordings_make_corpus_did_not_make_are_never_replaced(tmp_path, capsys):
    # a folder of the user's own LJ001-0001.wav, LJ001-0002.wav and a 3-line metadata.csv: the clips were
    # spoken over the recordings and metadata.csv cut to 2 lines, with exit status 0
    user = tmp_path / "user"
    (user / "wavs").mkdir(parents=True)
    for name in ("LJ001-0001", "LJ001-0002"):
        sf.write(str(user / "wavs" / f"{name}.wav"), np.full(2205, 0.1, "float32"), 22050)
    (user / "metadata.csv").write_text("".join(line + "\n" for line in _lines(3)), encoding="utf-8")
    before = checksums(user)
    line = refused(capsys, _argv(user, 2, "--format", "wav"))
    assert line.startswith(f"error: {user / 'metadata.csv'}: 1 of its 3 rows name clips make_corpus did not make "
                           "and are not among the 2 this run would write"), line
    assert line.endswith("give an empty or new --out"), line
    line = refused(capsys, _argv(user, 3, "--format", "wav"))  # metadata kept whole, the audio refused
    assert line == (f"error: {user / 'wavs' / 'LJ001-0001.wav'} (and 1 more in the clips' places): not made by "
                    "make_corpus (it has no make_corpus tag), so no clip replaces it or goes beside it; give an "
                    "empty or new --out"), line
    # in another format (the default flac beside the user's wav): the clips went beside the recordings, the
    # user's transcripts were replaced by the transcripts file's, and the corpus had clips in two formats
    line = refused(capsys, _argv(user, 3))
    assert line.startswith(f"error: {user / 'wavs' / 'LJ001-0001.wav'} (and 1 more in the clips' places): not made "
                           "by make_corpus"), line
    assert checksums(user) == before  # nothing spoken, nothing written: every target is checked first
    # the same for a voices corpus: a file in one of its clips' place
    (tmp_path / "v" / "wavs").mkdir(parents=True)
    (tmp_path / "v" / "wavs" / "en-us-LJ001-0002.flac").write_bytes(b"not audio")
    line = refused(capsys, _argv(tmp_path / "v", 1, "--voices", "en-gb,en-us"))
    assert re.search(r"en-us-LJ001-0002.flac: not made by make_corpus", line), line
    assert checksums(tmp_path / "v") == {"wavs/en-us-LJ001-0002.flac": hashlib.sha256(b"not audio").hexdigest()}


def test_a_run_that_would_rewrite_its_own_transcripts_is_refused(tmp_path, capsys):
    # --transcripts X/metadata.csv --out X: a smaller --count (or another --start) replaced the transcripts
    # with the lines it spoke; the other lines' text was gone, and no larger --count could take them back
    (tmp_path / "metadata.csv").write_text("\n".join(_lines(3)) + "\n", encoding="utf-8")
    argv = ["--transcripts", str(tmp_path / "metadata.csv"), "--out", str(tmp_path), "--format", "wav", "--jobs", "1"]
    mc.main([*argv, "--count", "3"])  # the same lines: nothing lost
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8").splitlines() == _lines(3)
    before = checksums(tmp_path)
    for more in (["--count", "1"], ["--count", "2", "--start", "1"]):
        line = refused(capsys, [*argv, *more])
        assert line.startswith(f"error: --transcripts {tmp_path / 'metadata.csv'} is the metadata.csv this run "
                               "writes"), line
    assert checksums(tmp_path) == before


def test_a_run_that_would_drop_a_users_metadata_rows_is_refused(tmp_path, capsys):
    # --transcripts X/metadata.csv --out X --count 3 on a corpus left 3 of its 90 rows: rows of clips
    # make_corpus made may go (a rerun makes them again), a user's own rows may not
    argv = _argv(tmp_path, 3, "--format", "wav", "--sample-rate", "16000")
    mc.main(argv)
    made = (tmp_path / "metadata.csv").read_text(encoding="utf-8")
    (tmp_path / "metadata.csv").write_text(made + "MY-0001|My own line.|My own line.\n", encoding="utf-8")
    before = checksums(tmp_path)
    for more in (["--count", "2"], ["--count", "3", "--start", "1"]):   # a smaller --count, another --start
        line = refused(capsys, [*argv, *more])
        assert line == (f"error: {tmp_path / 'metadata.csv'}: 1 of its 4 rows name clips make_corpus did not make and "
                        f"are not among the {more[1]} this run would write (first 'MY-0001|My own line.|My own "
                        "line.'); replacing it would lose them: give an empty or new --out"), line
    assert checksums(tmp_path) == before
    # its own rows alone: a smaller --count keeps the clips it made, and a larger one takes them back
    (tmp_path / "metadata.csv").write_text(made, encoding="utf-8")
    mc.main([*argv, "--count", "2"])
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8").splitlines() == _lines(2)
    assert (tmp_path / "wavs" / "LJ001-0003.wav").is_file()
    mc.main(argv)
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8") == made
    # a transcript line corrected: the same clip, made again with the new text
    fixed = tmp_path / "fixed.csv"
    fixed.write_text("\n".join(_lines(3)[:1] + [_lines(3)[1].replace(".", "!")] + _lines(3)[2:]) + "\n")
    mc.main(["--transcripts", str(fixed), *argv[2:]])
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8").splitlines()[1].endswith("!")
    # a voices corpus: a larger --count moves later voices onto other lines, rows of clips it made
    mc.main(_argv(tmp_path / "v", 1, "--voices", "en-us,en-gb", "--format", "wav"))
    mc.main(_argv(tmp_path / "v", 2, "--voices", "en-us,en-gb", "--format", "wav"))
    assert len((tmp_path / "v" / "metadata.csv").read_text().splitlines()) == 5
    # ... and a user's csv rows with no audio of make_corpus's
    (tmp_path / "u").mkdir()
    rows = [f"wavs/en-us-{line.split('|')[0]}.flac|{line.split('|')[2]}|en-us|en-us" for line in _lines(2)]
    (tmp_path / "u" / "metadata.csv").write_text("audio_file|text|speaker|language\n" + "\n".join(rows) + "\n")
    line = refused(capsys, _argv(tmp_path / "u", 1, "--voices", "en-us"))
    assert line.startswith(f"error: {tmp_path / 'u' / 'metadata.csv'}: 1 of its 3 rows name clips make_corpus did "
                           "not make and are not among the 2"), line
    assert not (tmp_path / "u" / "wavs").exists()


def test_the_same_command_again_a_larger_count_and_another_format_keep_every_row(tmp_path):
    argv = _argv(tmp_path, 2, "--format", "wav", "--sample-rate", "16000")
    mc.main(argv)
    before = checksums(tmp_path)
    made = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wavs").iterdir()}
    mc.main(argv)  # the same command: nothing to make, nothing changed
    assert checksums(tmp_path) == before
    assert made == {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wavs").iterdir()}
    mc.main(_argv(tmp_path, 3, "--format", "wav", "--sample-rate", "16000"))  # grow the corpus
    assert made.items() < {p.name: p.stat().st_mtime_ns for p in (tmp_path / "wavs").iterdir()}.items()
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8").splitlines() == _lines(3)
    assert {k: v for k, v in checksums(tmp_path).items() if k != "metadata.csv"}.items() > \
        {k: v for k, v in before.items() if k != "metadata.csv"}.items()
    mc.main(_argv(tmp_path, 3, "--sample-rate", "16000"))  # flac: the wav clips it made are redone
    assert sorted(p.name for p in (tmp_path / "wavs").iterdir()) == [f"LJ001-000{i}.flac" for i in (1, 2, 3)]
    assert (tmp_path / "metadata.csv").read_text(encoding="utf-8").splitlines() == _lines(3)
    # a voices corpus's rows name the audio file, whose extension another --format changes
    mc.main(_argv(tmp_path / "v", 1, "--voices", "en-us,en-gb", "--format", "wav"))
    mc.main(_argv(tmp_path / "v", 1, "--voices", "en-us,en-gb"))
    assert (tmp_path / "v" / "metadata.csv").read_text().splitlines()[1].startswith("wavs/en-us-LJ001-0001.flac|")
    assert sorted(p.suffix for p in (tmp_path / "v" / "wavs").iterdir()) == [".flac", ".flac"]


@pytest.mark.parametrize("whom", ["the command", "its process group, espeak-ng too, as a terminal's Ctrl-C"])
def test_ctrl_c_stops_with_one_line_and_status_130(tmp_path, whom):
    # make_corpus's main lacked @cli: a KeyboardInterrupt traceback and status -2
    out = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.make_corpus", *_argv(out, 200, "--format", "wav")],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list((out / "wavs").glob("*.wav")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        (os.killpg if whom.startswith("its") else os.kill)(proc.pid, signal.SIGINT)
        err = proc.communicate(timeout=120)[1]
    finally:
        proc.kill()
    assert (proc.returncode, err) == (130, "stopped (Ctrl-C)\n")
    made = list((out / "wavs").iterdir())
    assert 1 <= len(made) < 200 and all(p.suffix == ".wav" for p in made)  # whole clips, no temporary file
    assert not (out / "metadata.csv").exists()  # written last, once every clip is there


def test_a_full_disk_is_named_not_a_transcript_line(tmp_path, monkeypatch, capsys):
    # libsndfile says "System error." when the disk fills: the message named the transcript line
    def full(path, *args, **kwargs):
        raise sf.LibsndfileError(2)  # "System error."
    monkeypatch.setattr(mc, "write_atomic", full)
    monkeypatch.setattr(mc.shutil, "disk_usage", lambda path: SimpleNamespace(free=40960))
    line = refused(capsys, _argv(tmp_path, 1, "--format", "wav"))
    assert line == (f"error: no space left on device in {tmp_path / 'wavs'} (40 KiB free, writing LJ001-0001.wav); "
                    "free space and rerun (the clips made so far stay)"), line
    monkeypatch.setattr(mc.shutil, "disk_usage", lambda path: SimpleNamespace(free=9 << 30))
    line = refused(capsys, _argv(tmp_path, 1, "--format", "wav"))  # room to spare: another failure
    assert line.endswith("ljspeech_transcripts.csv:1: clip LJ001-0001: System error."), line
    monkeypatch.undo()

    def no_space(path, text):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(mc, "atomic_write_text", no_space)  # metadata.csv
    line = refused(capsys, _argv(tmp_path, 1, "--format", "wav"))
    assert line == f"error: no space left on device writing {tmp_path}; free space and rerun", line


def test_an_out_folder_whose_name_is_not_utf8_is_named(tmp_path, capsys):
    # libsndfile takes UTF-8 paths: each clip failed with an encoding error blamed on its transcript line
    out = tmp_path / os.fsdecode(b"corpus\xff")
    with pytest.raises(ValueError, match=r"--out .*corpus\\udcff': not a UTF-8 path"):
        mc.make_corpus(TRANSCRIPTS, out, count=1)
    line = refused(capsys, _argv(out, 1))
    assert "UTF-8" in line and "transcripts" not in line, line
    assert not out.exists()


def test_each_clip_speaks_the_normalized_text_column(tmp_path):
    (tmp_path / "t.csv").write_text("N1|Dr. Who, 1.|Doctor Who, one.\nN2|Plain text.|\n", encoding="utf-8")
    assert [r[1] for r in mc.read_transcripts(tmp_path / "t.csv")] == ["Doctor Who, one.", "Plain text."]
    mc.make_corpus(tmp_path / "t.csv", tmp_path / "c", count=2, fmt="wav", jobs=1)
    for clip, said in (("N1", "Doctor Who, one."), ("N2", "Plain text.")):
        with sf.SoundFile(tmp_path / "c" / "wavs" / f"{clip}.wav") as f:
            assert f.comment == mc._request_tag(said, "en-us", 175, mc.ESPEAK_RATE)


def test_a_clip_whose_write_fails_leaves_no_torn_file_that_a_rerun_would_keep(tmp_path, monkeypatch, capsys):
    written = sf.SoundFile.write

    def torn(self, data):
        written(self, data[:len(data) // 2])
        raise sf.LibsndfileError(2)  # "System error.", as a killed or failing write leaves it
    monkeypatch.setattr(sf.SoundFile, "write", torn)
    monkeypatch.setattr(mc.shutil, "disk_usage", lambda path: SimpleNamespace(free=9 << 30))
    refused(capsys, _argv(tmp_path, 1, "--format", "wav"))
    assert not list((tmp_path / "wavs").iterdir())
    monkeypatch.undo()
    assert mc.make_corpus(TRANSCRIPTS, tmp_path, count=1, fmt="wav")["made"] == 1


def test_the_bounds_of_each_number_are_taken_and_a_count_of_0_is_refused(tmp_path, capsys):
    mc.check_numbers(count=1, start=0, jobs=1, sample_rate=mc.SAMPLE_RATES[0], speed=mc.SPEEDS[0])
    mc.check_numbers(count=1, start=0, jobs=1, sample_rate=mc.SAMPLE_RATES[1], speed=mc.SPEEDS[1],
                     compression_level=1.0)
    line = refused(capsys, ["--transcripts", str(TRANSCRIPTS), "--out", str(tmp_path / "c"), "--count", "0"])
    assert line == "error: --count 0: 1 or more", line
    assert not (tmp_path / "c").exists()


def test_a_second_run_into_one_out_stops_at_its_start_naming_the_first(tmp_path):
    # two runs into one --out at once: each removed the other's temporary clips as a killed run's
    # leftovers, and failed on the lines whose clips went. The second stops now, before anything, naming
    # the first, which holds OUT/.make_corpus.lock (held here by this process, as a run holds it)
    import socket

    from pipeline import files
    out, lock = tmp_path / "c", tmp_path / "c" / ".make_corpus.lock"
    (out / "wavs").mkdir(parents=True)
    writing = out / "wavs" / ".LJ001-0001.wav.tmp4242"             # the first run's clip, half written
    writing.write_bytes(b"half a clip")
    with files.exclusive(lock, str):
        proc = subprocess.run([sys.executable, "-m", "pipeline.make_corpus", *_argv(out, 2, "--format", "wav")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr == (
            f"error: --out {out}: another make_corpus is writing this corpus now (process {os.getpid()} on "
            f"{socket.gethostname()} holds {lock}); wait for it to end, or give another --out\n"), proc.stderr
        assert writing.read_bytes() == b"half a clip" and sorted(os.listdir(out / "wavs")) == [writing.name]
    assert sorted(os.listdir(out)) == ["wavs"]                          # the lock goes with its run
    # a killed run's lock file (its process gone, the kernel let go of the lock): taken over, never a clip,
    # a leftover or a row, and gone once the run ends
    lock.write_text("process 4242 on a-node\n")
    proc = subprocess.run([sys.executable, "-m", "pipeline.make_corpus", *_argv(out, 2, "--format", "wav")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (out / "metadata.csv").read_text(encoding="utf-8").splitlines() == _lines(2)
    assert sorted(os.listdir(out)) == ["metadata.csv", "wavs"]
    assert sorted(os.listdir(out / "wavs")) == ["LJ001-0001.wav", "LJ001-0002.wav"]
    lock.write_text("process 4242 on a-node\n")                         # and a voices corpus's run the same
    with files.exclusive(lock, str):
        line = subprocess.run([sys.executable, "-m", "pipeline.make_corpus", *_argv(out, 1, "--voices", "en-us,en-gb")],
                              cwd=ROOT, capture_output=True, text=True, timeout=120).stderr
        assert line.startswith(f"error: --out {out}: another make_corpus is writing this corpus now (process "
                               f"{os.getpid()} on "), line
