"""pipeline/formats.py: one reader per corpus layout (fixture folders laid out as LJSpeech, VCTK 0.92
and 0.80, LibriTTS and the csv format are), ids unique across sources, speakers and languages per
row, and each kind of bad input as one DatasetError naming the file, line or key.

    python -m pytest -q tests/test_formats.py
"""
import os
import re
import shutil

import pytest
import soundfile as sf
from conftest import snakemake, write_config

from pipeline import config, formats, manifest
from pipeline.formats import DatasetError

TEXTS = ["Please call Stella.", "Ask her to bring these things.", "Six spoons of fresh snow peas."]


def _tone(path, seconds=0.3, sr=22050):
    import numpy as np
    t = np.arange(int(seconds * sr)) / sr
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), (0.3 * np.sin(2 * np.pi * 220 * t)).astype("float32"), sr, subtype="PCM_16")


def make_vctk(root, speakers=("p225", "p226"), n=2, trimmed=True):
    for spk in speakers:
        for k in range(1, n + 1):
            cid = f"{spk}_{k:03d}"
            (root / "txt" / spk).mkdir(parents=True, exist_ok=True)
            (root / "txt" / spk / f"{cid}.txt").write_text(TEXTS[k % 3] + "\n")
            if trimmed:
                _tone(root / "wav48_silence_trimmed" / spk / f"{cid}_mic1.flac")
                _tone(root / "wav48_silence_trimmed" / spk / f"{cid}_mic2.flac")
            else:
                _tone(root / "wav48" / spk / f"{cid}.wav")
    return root


def make_libritts(root, speakers=("19", "26"), n=2):
    for spk in speakers:
        folder = root / spk / "198"
        folder.mkdir(parents=True, exist_ok=True)
        for k in range(n):
            cid = f"{spk}_198_{k:06d}_000000"
            (folder / f"{cid}.normalized.txt").write_text(TEXTS[k % 3])
            (folder / f"{cid}.original.txt").write_text(TEXTS[k % 3].upper())
            _tone(folder / f"{cid}.wav")
    return root


def make_csv(root, rows, header="audio_file|text|speaker|language"):
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata.csv").write_text("\n".join([header, *rows]) + "\n")
    at = header.split("|").index("audio_file")
    for row in rows:
        _tone(root / row.split("|")[at])
    return root


def test_vctk_092_and_080_layouts(tmp_path):
    for trimmed in (True, False):
        root = make_vctk(tmp_path / f"vctk{trimmed}", trimmed=trimmed)
        clips = formats.read_sources([{"root": str(root), "format": "vctk", "language": "en-gb", "name": "vctk"}])
        assert [(c.id, c.speaker, c.language) for c in clips] == [
            ("vctk-p225_001", "p225", "en-gb"), ("vctk-p225_002", "p225", "en-gb"),
            ("vctk-p226_001", "p226", "en-gb"), ("vctk-p226_002", "p226", "en-gb")]
        assert clips[0].text == TEXTS[1]
        want = "wav48_silence_trimmed/p225/p225_001_mic1.flac" if trimmed else "wav48/p225/p225_001.wav"
        assert clips[0].audio == str(root / want)  # mic1, never mic2
        assert clips[0].where == str(root / "txt" / "p225" / "p225_001.txt")


def test_libritts_layout_reads_normalized_text(tmp_path):
    root = make_libritts(tmp_path / "LibriTTS")
    clips = formats.read_sources([{"root": str(root), "format": "libritts"}])
    assert [(c.id, c.speaker) for c in clips] == [
        ("LibriTTS-19_198_000000_000000", "19"), ("LibriTTS-19_198_000001_000000", "19"),
        ("LibriTTS-26_198_000000_000000", "26"), ("LibriTTS-26_198_000001_000000", "26")]
    assert clips[1].text == TEXTS[1] and clips[1].language == ""  # "": text.language
    assert clips[1].audio == str(root / "19" / "198" / "19_198_000001_000000.wav")


def test_ljspeech_and_csv_sources(tmp_path):
    lj = tmp_path / "LJSpeech-1.1"
    (lj / "wavs").mkdir(parents=True)
    (lj / "metadata.csv").write_text("LJ001-0001|Hello there.|Hello there.\n")
    _tone(lj / "wavs" / "LJ001-0001.wav")
    mine = make_csv(tmp_path / "mine", ["a/x1.wav|Guten Tag.|anna|de", "a/x2.wav|Good day.|bob|"])
    clips = formats.read_sources([{"root": str(lj), "format": "ljspeech", "speaker": "lj", "language": "en-us"},
                                  {"root": str(mine), "format": "csv", "language": "en-gb"}])
    assert [(c.id, c.speaker, c.language, c.source) for c in clips] == [
        ("LJSpeech-1.1-LJ001-0001", "lj", "en-us", "LJSpeech-1.1"),
        ("mine-x1", "anna", "de", "mine"), ("mine-x2", "bob", "en-gb", "mine")]  # a row's own language wins
    assert clips[1].audio == str(mine / "a" / "x1.wav") and clips[1].where == f"{mine / 'metadata.csv'}:2"
    # the csv columns may come in any order, language may be left out
    other = make_csv(tmp_path / "other", ["Hi.|y1.wav|cy"], header="text|audio_file|speaker")
    assert [(c.id, c.text, c.speaker) for c in formats.read_sources([{"root": str(other), "format": "csv"}])] == \
        [("other-y1", "Hi.", "cy")]


def test_ids_speakers_and_languages_do_not_depend_on_other_sources(tmp_path):
    a = make_vctk(tmp_path / "a")
    b = make_libritts(tmp_path / "b")
    alone = formats.read_sources([{"root": str(a), "format": "vctk"}])
    both = formats.read_sources([{"root": str(b), "format": "libritts"}, {"root": str(a), "format": "vctk"}])
    assert {c.id: (c.line, manifest.shard_of(c.id, 8)) for c in alone}.items() <= \
        {c.id: (c.line, manifest.shard_of(c.id, 8)) for c in both}.items()


def _error(sources):
    with pytest.raises(DatasetError) as e:
        formats.read_sources(sources)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_input_names_the_file_line_or_key(tmp_path):
    good = make_vctk(tmp_path / "good")
    short = make_csv(tmp_path / "short", ["x1.wav|Hello.|anna|en-us", "x2.wav|Hello.|anna"])
    assert re.search(rf"{re.escape(str(short / 'metadata.csv'))}:3: expected 4 fields", _error(
        [{"root": str(short), "format": "csv"}]))
    slash = make_csv(tmp_path / "slash", ["x1.wav|Hello.|an/na|en-us"])
    assert f"{slash / 'metadata.csv'}:2: speaker 'an/na'" in _error([{"root": str(slash), "format": "csv"}])
    assert "dataset.sources[0].speaker: speaker 'a\\\\b'" in _error(
        [{"root": str(slash), "format": "csv", "speaker": "a\\b"}])
    nospeaker = make_csv(tmp_path / "nospk", ["x1.wav|Hello."], header="audio_file|text")
    assert "no speaker column" in _error([{"root": str(nospeaker), "format": "csv"}])
    (tmp_path / "empty").mkdir()
    assert "dataset.sources[1].root" in _error([{"root": str(good), "format": "vctk"},
                                                {"root": str(tmp_path / "empty"), "format": "vctk"}])
    assert "dataset.sources[1].name: 'good' is also the name of dataset.sources[0]" in _error(
        [{"root": str(good), "format": "vctk"}, {"root": str(short), "format": "csv", "name": "good"}])
    assert "dataset.sources[0].format: unknown format 'kaldi'; valid: ljspeech, vctk, libritts, csv" in _error(
        [{"root": str(good), "format": "kaldi"}])
    twice = make_csv(tmp_path / "twice", ["a/x.wav|One.|anna", "b/x.wav|Two.|anna"], header="audio_file|text|speaker")
    message = _error([{"root": str(twice), "format": "csv"}])
    assert "'twice-x' twice" in message and ":2" in message and ":3" in message


def test_unknown_espeak_language_fails_planning(tmp_path, corpus_template):
    shutil.copytree(corpus_template, tmp_path / "lj")
    mine = make_csv(tmp_path / "mine", ["x1.wav|Hello.|anna|en-us", "x2.wav|Hello.|bob|xx-nowhere"])
    config = write_config(tmp_path, tmp_path / "lj", dataset={"sources": [
        {"root": str(tmp_path / "lj"), "format": "ljspeech", "language": "en-us"},
        {"root": str(mine), "format": "csv"}]})
    proc = snakemake("caches", "-n", config=config, check=False)
    assert proc.returncode != 0
    assert f"{mine / 'metadata.csv'}:3: language 'xx-nowhere'" in proc.stdout + proc.stderr
    assert not (tmp_path / "cache").exists()


def test_the_control_characters_refused_are_unicodes_cc_less_whitespace():
    # the check is one character class built from U+0000-U+009F: no control character elsewhere
    import unicodedata
    want = {c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cc" and not chr(c).isspace()}
    assert {c for c in range(0x110000) if formats._CONTROL.match(chr(c))} == want
    assert 0 in want and 0x1B in want and 0x7F in want and 0x9B in want and 0x0A not in want


def test_control_characters_and_file_named_ids_are_refused_naming_the_file(tmp_path):
    # a NUL ends the text where espeak-ng reads it (the rest of the clip would train on nothing);
    # an escape sequence's digits would be read aloud
    lj = tmp_path / "lj"
    (lj / "wavs").mkdir(parents=True)
    (lj / "metadata.csv").write_text("a1|The first clip.\na2|The\x00 second clip says something else.\n")
    assert _error([{"root": str(lj), "format": "ljspeech"}]) == (
        f"{lj / 'metadata.csv'}:2: control character U+0000 at character 7 (a transcript is plain text: remove it)")
    (lj / "metadata.csv").write_text("a1|hi\x1b[31mred\n")
    assert "U+001B" in _error([{"root": str(lj), "format": "ljspeech"}])
    (lj / "metadata.csv").write_text("a1|The first\tclip.\r\n")  # tabs and CRLF are whitespace: read
    assert [c.text for c in formats.read_sources([{"root": str(lj), "format": "ljspeech"}])] == ["The first\tclip."]
    csv = make_csv(tmp_path / "csv", ["x1.wav|Hello\x07 there.|anna|en-us"])
    assert _error([{"root": str(csv), "format": "csv"}]).startswith(f"{csv / 'metadata.csv'}:2: control character U+0007")
    vctk = make_vctk(tmp_path / "vctk", speakers=("p225",), n=1)
    (vctk / "txt" / "p225" / "p225_001.txt").write_text("Hello\x00 there.\n")
    assert _error([{"root": str(vctk), "format": "vctk"}]).startswith(f"{vctk / 'txt' / 'p225' / 'p225_001.txt'}: control")
    # vctk and libritts take ids and speakers from file and folder names: the ljspeech rule applies
    vctk = make_vctk(tmp_path / "vctk2", speakers=("p225",), n=1)
    (vctk / "txt" / "p225" / "p225_001.txt").rename(vctk / "txt" / "p225" / "p225_t\tab.txt")
    assert "gives the clip id 'p225_t\\tab', not a plain name" in _error(
        [{"root": str(vctk), "format": "vctk"}])
    libri = make_libritts(tmp_path / "libri", speakers=("19",), n=1)
    txt = next((libri / "19" / "198").glob("*.normalized.txt"))
    txt.rename(txt.with_name("a b;c$(id).normalized.txt"))
    assert "gives the clip id 'a b;c$(id)'" in _error([{"root": str(libri), "format": "libritts"}])
    libri = make_libritts(tmp_path / "libri2", speakers=("19",), n=1)
    (libri / "19").rename(libri / "spk\n1")
    assert f"{libri}: folder: speaker 'spk\\n1' must be a plain name" in _error([{"root": str(libri), "format": "libritts"}])
    # a trailing newline is not part of a plain name (a regex's $ would have let it through)
    assert "dataset.sources[0].name: 'lj\\n' is not a plain name" in _error(
        [{"root": str(lj), "format": "ljspeech", "name": "lj\n"}])


def test_one_recording_under_two_clips_is_refused_naming_both(tmp_path, corpus_template):
    # it would train under one id and validate under the other
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    message = _error([{"root": str(lj), "format": "ljspeech", "name": "a"},
                      {"root": str(lj), "format": "ljspeech", "name": "b"}])
    assert message.startswith(f"clip 'a-LJ001-0001' of source 'a' ({lj / 'metadata.csv'}:1) and clip 'b-LJ001-0001' "
                              f"of source 'b' ({lj / 'metadata.csv'}:1) are one audio file {lj / 'wavs' / 'LJ001-0001.wav'}")
    (tmp_path / "link").symlink_to(lj)  # a folder reached through a link
    assert "are one audio file" in _error([{"root": str(lj), "format": "ljspeech", "name": "a"},
                                           {"root": str(tmp_path / "link"), "format": "ljspeech", "name": "b"}])
    mine = make_csv(tmp_path / "mine", ["x1.wav|Hello.|anna|en-us"])
    (mine / "x2.wav").symlink_to(lj / "wavs" / "LJ001-0002.wav")  # a file that is a link
    with open(mine / "metadata.csv", "a") as f:
        f.write("x2.wav|Hello.|anna|en-us\n")
    assert f"and clip 'mine-x2' of source 'mine' ({mine / 'metadata.csv'}:3) are one audio file" in _error(
        [{"root": str(lj), "format": "ljspeech"}, {"root": str(mine), "format": "csv"}])
    (lj / "wavs" / "LJ001-0003.wav").unlink()
    (lj / "wavs" / "LJ001-0003.wav").symlink_to("LJ001-0001.wav")  # within one source
    assert "clip 'lj-LJ001-0001' of source 'lj'" in _error([{"root": str(lj), "format": "ljspeech"}])
    hard = make_csv(tmp_path / "hard", ["x1.wav|Hello.|anna|en-us"])
    os.link(hard / "x1.wav", hard / "x2.wav")  # a hard link: another path, the same file
    with open(hard / "metadata.csv", "a") as f:
        f.write("x2.wav|Goodbye.|anna|en-us\n")
    assert _error([{"root": str(hard), "format": "csv"}]).startswith(
        f"clip 'hard-x1' of source 'hard' ({hard / 'metadata.csv'}:2) and clip 'hard-x2' of source 'hard' "
        f"({hard / 'metadata.csv'}:3) are one audio file {hard / 'x1.wav'} (hard-linked as {hard / 'x2.wav'})")
    # and planning stops on it
    config = write_config(tmp_path, lj, dataset={"sources": [{"root": str(mine), "format": "csv", "name": "a"},
                                                             {"root": str(mine), "format": "csv", "name": "b"}]})
    proc = snakemake("caches", "-n", config=config, check=False)
    assert proc.returncode != 0 and "'b-x1' of source 'b'" in proc.stdout + proc.stderr


def test_a_language_is_checked_as_the_token_job_spells_it(tmp_path, corpus_template):
    # the token job's espeak-ng backend looks a code up exactly: planning must not pass what it refuses
    from pipeline import text
    known = text.espeak_languages()

    def check(language, source_language=None):
        mine = make_csv(tmp_path / f"m{len(list(tmp_path.iterdir()))}", [f"x1.wav|Good morning.|alice|{language}"])
        src = {"root": str(mine), "format": "csv", **({"language": source_language} if source_language else {})}
        with pytest.raises(DatasetError) as e:
            formats.check_languages(formats.read_sources([src]), known, "en-us")
        return mine, str(e.value)

    mine, message = check("en-US")
    assert message == (f"{mine / 'metadata.csv'}:2: language 'en-US' (from its source's `language`, its csv column "
                       "or text.language): espeak-ng spells it 'en-us' and the token job looks it up as written; "
                       "write that")
    assert "language 'EN-US'" in check("", "EN-US")[1]  # a source's language
    message = check("fr")[1]  # a voice's other language, which the backend does not take
    assert "language 'fr' (from" in message and "is not an espeak-ng voice" in message and "fr-fr" in message
    for good in ("en-us", "en-gb", "de"):  # as espeak-ng spells them: through
        formats.check_languages(formats.read_sources([{"root": str(make_csv(
            tmp_path / good, [f"x1.wav|Good morning.|alice|{good}"])), "format": "csv"}]), known, "en-us")
    # and `snakemake -n` stops on it, before any job
    config = write_config(tmp_path, corpus_template, dataset={"sources": [{"root": str(mine), "format": "csv"}]})
    proc = snakemake("caches", "-n", config=config, check=False)
    assert proc.returncode != 0 and f"{mine / 'metadata.csv'}:2: language 'en-US'" in proc.stdout + proc.stderr


def test_a_clip_with_audio_in_two_formats_is_refused(tmp_path, corpus_template):
    # a second make_corpus in flac, or a conversion in place, left the old .wav: it trained silently
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    shutil.copy(lj / "wavs" / "LJ001-0002.wav", lj / "wavs" / "LJ001-0002.flac")
    assert _error([{"root": str(lj), "format": "ljspeech"}]) == (
        f"{lj / 'metadata.csv'}:2: clip 'LJ001-0002' has audio in 2 formats (LJ001-0002.wav, LJ001-0002.flac) beside "
        "each other; keep one (the pipeline would read LJ001-0002.wav and ignore the rest)")
    vctk = make_vctk(tmp_path / "vctk", trimmed=False)
    shutil.copy(vctk / "wav48" / "p226" / "p226_002.wav", vctk / "wav48" / "p226" / "p226_002.ogg")
    assert _error([{"root": str(vctk), "format": "vctk"}]).startswith(
        f"{vctk / 'txt' / 'p226' / 'p226_002.txt'}: clip 'p226_002' has audio in 2 formats (p226_002.wav, p226_002.ogg)")
    # the single-folder form, at planning; a stray pair of no listed clip is no one's business
    (lj / "wavs" / "LJ001-0002.flac").rename(lj / "wavs" / "stray.flac")
    shutil.copy(lj / "wavs" / "stray.flac", lj / "wavs" / "stray.ogg")
    config = write_config(tmp_path, lj)
    assert snakemake("caches", "-n", config=config, check=False).returncode == 0
    shutil.copy(lj / "wavs" / "LJ001-0005.wav", lj / "wavs" / "LJ001-0005.ogg")
    proc = snakemake("caches", "-n", config=config, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"{lj / 'metadata.csv'}:5: clip 'LJ001-0005' has audio in 2 formats" in out, out
    assert "Traceback" not in out


def test_audio_extensions_in_capitals_are_found(tmp_path, corpus_template):
    # field recorders and TIMIT write .WAV: the single folder said "holds none of the clips' audio files"
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    for wav in (lj / "wavs").glob("*.wav"):
        wav.rename(wav.with_suffix(".WAV"))
    assert manifest.audio_path(lj, "wavs", "LJ001-0001") == lj / "wavs" / "LJ001-0001.WAV"
    files = manifest.audio_files(lj, "wavs")
    assert files["LJ001-0001"].startswith("LJ001-0001.WAV:") and len(files) == len(list((lj / "wavs").iterdir()))
    [first, *_] = formats.read_sources([{"root": str(lj), "format": "ljspeech"}])
    assert first.audio.endswith("LJ001-0001.WAV")
    assert snakemake("caches", "-n", config=write_config(tmp_path, lj), check=False).returncode == 0
    (lj / "wavs" / "LJ001-0003.WAV").rename(lj / "wavs" / "LJ001-0003.Wav")  # any case, as planning found it
    assert manifest.audio_path(lj, "wavs", "LJ001-0003") == lj / "wavs" / "LJ001-0003.Wav"
    assert manifest.audio_files(lj, "wavs")["LJ001-0003"].startswith("LJ001-0003.Wav:")
    # beside a lower-case twin it is a second format of one clip, refused as any other
    shutil.copy(lj / "wavs" / "LJ001-0002.WAV", lj / "wavs" / "LJ001-0002.flac")
    assert "has audio in 2 formats (LJ001-0002.WAV, LJ001-0002.flac)" in _error([{"root": str(lj), "format": "ljspeech"}])


def test_an_id_written_with_its_files_extension_names_its_line(tmp_path, corpus_template):
    # `LJ001-0003.wav|...` looked for wavs/LJ001-0003.wav.wav: that clip was left out as missing audio
    # without a word at planning, and every id so written was "an empty or unmounted folder?"
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    lines = (lj / "metadata.csv").read_text().splitlines()
    lines[2] = lines[2].replace("LJ001-0003|", "LJ001-0003.WAV|", 1)
    (lj / "metadata.csv").write_text("\n".join(lines) + "\n")
    said = (f"{lj / 'metadata.csv'}:3: id 'LJ001-0003.WAV' ends with its audio file's extension; an id is the file's "
            f"name without it ({lj / 'wavs'}/LJ001-0003.WAV.wav|flac|ogg is looked for): write 'LJ001-0003'")
    proc = snakemake("caches", "-n", config=write_config(tmp_path, lj), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and f"error: {said}" in out and "Traceback" not in out, out
    assert _error([{"root": str(lj), "format": "ljspeech"}]) == said
    # every id so written: the first line, not "an empty or unmounted folder"
    (lj / "metadata.csv").write_text("".join(re.sub(r"^(LJ[0-9-]+)\|", r"\1.wav|", line) + "\n" for line in lines))
    proc = snakemake("caches", "-n", config=write_config(tmp_path, lj), check=False)
    assert f"{lj / 'metadata.csv'}:1: id 'LJ001-0001.wav' ends with its audio file's extension" in proc.stderr, proc.stderr
    # an id whose own file carries the extension twice is its file's name
    (lj / "metadata.csv").write_text(lines[0].replace("LJ001-0001|", "LJ001-0001.wav|", 1) + "\n")
    (lj / "wavs" / "LJ001-0001.wav").rename(lj / "wavs" / "LJ001-0001.wav.wav")
    [clip] = formats.read_sources([{"root": str(lj), "format": "ljspeech"}])
    assert clip.id == "lj-LJ001-0001.wav" and clip.audio == str(lj / "wavs" / "LJ001-0001.wav.wav")


def test_the_single_folder_form_refuses_one_recording_under_two_ids(tmp_path, corpus_template):
    # docs/datasets.md promised it for every form; only dataset.sources checked
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    (lj / "wavs" / "LJ001-0003.wav").unlink()
    (lj / "wavs" / "LJ001-0003.wav").symlink_to("LJ001-0001.wav")
    proc = snakemake("caches", "-n", config=write_config(tmp_path, lj), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert (f"clip 'LJ001-0001' ({lj / 'metadata.csv'}:1) and clip 'LJ001-0003' ({lj / 'metadata.csv'}:3) are one "
            f"audio file {lj / 'wavs' / 'LJ001-0001.wav'}") in out, out


def test_ids_that_differ_only_in_case_are_two_clips_where_they_are_two_files(tmp_path, corpus_template):
    # a corpus that trained on Linux keeps training; where the file system makes them one file, the two
    # ids name one recording, which planning refuses as it refuses a link (one audio file, two clips)
    path = tmp_path / "metadata.csv"
    path.write_text("A1|One.\nb2|Two.\na1|Three.\n")
    assert [c.id for c in formats.read_metadata(path)] == ["A1", "b2", "a1"]
    mine = make_csv(tmp_path / "mine", ["X1.wav|Hello.|anna|en-us", "x1.flac|Hi.|anna|en-us"])
    assert [c.id for c in formats.read_sources([{"root": str(mine), "format": "csv"}])] == ["mine-X1", "mine-x1"]
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    lines = (lj / "metadata.csv").read_text().splitlines()
    (lj / "metadata.csv").write_text("\n".join(lines + [lines[0].replace("LJ001-0001", "lj001-0001", 1)]) + "\n")
    (lj / "wavs" / "lj001-0001.wav").symlink_to("LJ001-0001.wav")  # what a case-insensitive disk resolves to
    proc = snakemake("caches", "-n", config=write_config(tmp_path, lj), check=False)
    assert proc.returncode == 1 and "clip 'LJ001-0001'" in proc.stdout + proc.stderr and \
        "are one audio file" in proc.stdout + proc.stderr


def test_a_csv_that_is_not_utf8_names_its_line(tmp_path):
    mine = make_csv(tmp_path / "mine", ["x1.wav|Hello.|anna|en-us", "x2.wav|Hi.|anna|en-us"])
    raw = (mine / "metadata.csv").read_bytes()
    (mine / "metadata.csv").write_bytes(raw.replace(b"Hi.", "Hé.".encode("latin-1")))
    assert _error([{"root": str(mine), "format": "csv"}]) == f"{mine / 'metadata.csv'}:3: not UTF-8 (byte 9 of the line)"
    (mine / "metadata.csv").write_bytes(raw.decode().encode("utf-16"))
    assert _error([{"root": str(mine), "format": "csv"}]) == (
        f"{mine / 'metadata.csv'}: UTF-16 (it starts with a UTF-16 byte order mark); save it as UTF-8")


def test_a_csv_file_name_with_a_space_says_what_a_plain_name_is(tmp_path):
    mine = make_csv(tmp_path / "mine", ["wavs/take 2.wav|Hello.|anna|en-us"])
    assert _error([{"root": str(mine), "format": "csv"}]) == (
        f"{mine / 'metadata.csv'}:2: audio_file 'wavs/take 2.wav' is not a plain file name under {mine} "
        "(letters, digits, '_', '-', '.')")


def test_an_unreadable_transcript_file_is_one_line(tmp_path):
    vctk = make_vctk(tmp_path / "vctk", trimmed=False)
    txt = vctk / "txt" / "p225" / "p225_002.txt"
    txt.unlink()
    txt.symlink_to("/nonexistent/p225_002.txt")  # a broken link
    assert _error([{"root": str(vctk), "format": "vctk"}]) == (
        f"{txt}: cannot read the transcript (No such file or directory)")
    txt.unlink()
    txt.mkdir()  # a folder named like a transcript
    assert _error([{"root": str(vctk), "format": "vctk"}]) == f"{txt}: cannot read the transcript (Is a directory)"


def test_links_into_folders_of_their_own_are_compared_by_stat(tmp_path):
    # git-annex keeps each file in a folder of its own: listing each cost 0.77 s a plan on 13,100 clips
    mine = make_csv(tmp_path / "mine", [])
    rows = []
    for name, key in (("a", "1"), ("b", "2"), ("c", "1")):
        _tone(mine / "objects" / key / f"{key}.wav")
        (mine / "wavs").mkdir(exist_ok=True)
        (mine / "wavs" / f"{name}.wav").symlink_to(f"../objects/{key}/{key}.wav")
        rows.append(f"wavs/{name}.wav|Hello.|anna|en-us")
    (mine / "metadata.csv").write_text("\n".join(["audio_file|text|speaker|language", *rows[:2]]) + "\n")
    assert len(formats.read_sources([{"root": str(mine), "format": "csv"}])) == 2   # two objects, two clips
    (mine / "metadata.csv").write_text("\n".join(["audio_file|text|speaker|language", *rows]) + "\n")
    assert _error([{"root": str(mine), "format": "csv"}]).startswith(
        f"clip 'mine-a' of source 'mine' ({mine / 'metadata.csv'}:2) and clip 'mine-c' of source 'mine' "
        f"({mine / 'metadata.csv'}:4) are one audio file {mine / 'objects' / '1' / '1.wav'}")


def test_a_link_target_is_read_from_the_folder_the_link_really_is_in(tmp_path):
    # wavs/ on another disk (a link), a.wav -> ../objects/x.wav: `..` was taken from the corpus's own
    # folder, where another objects/x.wav sits, and the real duplicate went unpaired
    disk, mine = tmp_path / "disk", make_csv(tmp_path / "mine", [])
    _tone(disk / "objects" / "x.wav")
    (disk / "wavs").mkdir()
    (disk / "wavs" / "a.wav").symlink_to("../objects/x.wav")
    (mine / "wavs").symlink_to(disk / "wavs")
    (mine / "alias.wav").symlink_to(disk / "objects" / "x.wav")
    _tone(mine / "objects" / "x.wav", seconds=0.4)  # another recording, under the same relative name
    rows = ["objects/x.wav|One.|anna|en-us", "wavs/a.wav|Two.|anna|en-us", "alias.wav|Three.|anna|en-us"]
    (mine / "metadata.csv").write_text("\n".join(["audio_file|text|speaker|language", *rows]) + "\n")
    assert _error([{"root": str(mine), "format": "csv"}]).startswith(
        f"clip 'mine-a' of source 'mine' ({mine / 'metadata.csv'}:3) and clip 'mine-alias' of source 'mine' "
        f"({mine / 'metadata.csv'}:4) are one audio file {disk / 'objects' / 'x.wav'}")


def test_a_name_a_case_ignoring_disk_finds_is_compared_by_stat(tmp_path, corpus_template, monkeypatch):
    # on macOS a1.wav is A1.wav: not in the folder's listing, yet the mel job opens it, so two ids
    # trained on one recording. Simulated here: a1.wav a hard link the listing does not show
    from pipeline import preflight
    lj = shutil.copytree(corpus_template, tmp_path / "lj")
    lines = (lj / "metadata.csv").read_text().splitlines()
    (lj / "metadata.csv").write_text("\n".join(lines + [lines[0].replace("LJ001-0001", "lj001-0001", 1)]) + "\n")
    os.link(lj / "wavs" / "LJ001-0001.wav", lj / "wavs" / "lj001-0001.wav")
    real_listing = formats._listing

    def case_ignoring(folder):
        found = real_listing(folder)
        return found and (found[0], {k: v for k, v in found[1].items() if k != "lj001-0001.wav"}, found[2])
    monkeypatch.setattr(formats, "_listing", case_ignoring)
    cfg = config.load_config(write_config(tmp_path, lj))
    audio = manifest.audio_files(lj, "wavs")
    del audio["lj001-0001"]  # the scan lists names as the disk keeps them
    with pytest.raises(DatasetError, match="clip 'LJ001-0001' .* and clip 'lj001-0001' .* are one audio file"):
        preflight.check_audio(cfg, manifest.load_manifest(cfg["dataset"], 4), audio, {})


def test_a_csv_row_with_more_fields_than_the_header_names_its_line(tmp_path):
    # a `|` inside the text made a fourth field: zip() dropped it, and "there." became the speaker
    extra = make_csv(tmp_path / "extra", ["x1.wav|Hello|there.|anna"], header="audio_file|text|speaker")
    assert f"{extra / 'metadata.csv'}:2: expected 3 fields (audio_file|text|speaker), found 4" in _error(
        [{"root": str(extra), "format": "csv"}])


def test_a_source_speaker_with_surrounding_spaces_is_refused(tmp_path):
    # "anna " and "anna" would be two speakers of one voice
    nospeaker = make_csv(tmp_path / "nospk", ["x1.wav|Hello."], header="audio_file|text")
    assert "dataset.sources[0].speaker: speaker 'anna ' must be a plain name" in _error(
        [{"root": str(nospeaker), "format": "csv", "speaker": "anna "}])


def test_a_transcript_files_line_breaks_and_tabs_read_as_single_spaces(tmp_path):
    root = make_libritts(tmp_path / "LibriTTS", speakers=("19",), n=1)
    txt = next((root / "19" / "198").glob("*.normalized.txt"))
    txt.write_text("Please call\nStella.\t  Now.\n")
    [clip] = formats.read_sources([{"root": str(root), "format": "libritts"}])
    assert clip.text == "Please call Stella. Now."


def test_a_vctk_092_corpus_converted_to_wav_finds_its_mic1_clips(tmp_path):
    root = make_vctk(tmp_path / "vctk", speakers=("p225",), n=1)
    folder = root / "wav48_silence_trimmed" / "p225"
    for flac in list(folder.glob("*.flac")):
        _tone(flac.with_suffix(".wav"))
        flac.unlink()
    [clip] = formats.read_sources([{"root": str(root), "format": "vctk"}])
    assert clip.audio == str(folder / "p225_001_mic1.wav")


def _ljspeech(root, metadata=b"a1|Hello there.\na2|Good bye.\n"):
    (root / "wavs").mkdir(parents=True)
    (root / "metadata.csv").write_bytes(metadata)
    for cid in ("a1", "a2"):
        _tone(root / "wavs" / f"{cid}.wav")
    return root


def test_a_table_with_cr_line_endings_is_refused_not_read_as_one_row(tmp_path):
    # split on LF alone, old Mac line endings gave one row: clip a1 with a2's text, a2 gone, no word
    lj = _ljspeech(tmp_path / "lj", b"a1|Hello there.\ra2|Good bye.\r")
    assert _error([{"root": str(lj), "format": "ljspeech"}]) == (
        f"{lj / 'metadata.csv'}:1: a carriage return (CR) inside the line: the file ends its lines with CR alone "
        "(old Mac line endings) or holds a stray CR; save it with LF (or CRLF) line endings")
    mine = make_csv(tmp_path / "mine", ["x1.wav|Hello.|anna", "x2.wav|Hi.|anna"], header="audio_file|text|speaker")
    (mine / "metadata.csv").write_bytes((mine / "metadata.csv").read_bytes().replace(b"\n", b"\r"))
    assert _error([{"root": str(mine), "format": "csv"}]).startswith(f"{mine / 'metadata.csv'}:1: a carriage return")
    # make_corpus reads its transcripts the same way
    from pipeline import make_corpus
    with pytest.raises(DatasetError, match=r"metadata.csv:1: a carriage return"):
        make_corpus.transcript_rows(lj / "metadata.csv")
    # CRLF and a trailing CR are line endings, as before
    (lj / "metadata.csv").write_bytes(b"a1|Hello there.\r\na2|Good bye.\r\r\n")
    assert [(c.id, c.text) for c in formats.read_sources([{"root": str(lj), "format": "ljspeech"}])] == [
        ("lj-a1", "Hello there."), ("lj-a2", "Good bye.")]


def test_a_data_path_that_is_no_file_or_no_folder_is_one_line(tmp_path):
    mine = make_csv(tmp_path / "mine", ["x1.wav|Hello.|anna"], header="audio_file|text|speaker")
    (mine / "metadata.csv").unlink()
    (mine / "metadata.csv").mkdir()
    assert _error([{"root": str(mine), "format": "csv"}]) == f"{mine / 'metadata.csv'}: cannot read it (Is a directory)"
    lj = _ljspeech(tmp_path / "lj")
    shutil.rmtree(lj / "wavs")
    (lj / "wavs").write_text("not a folder")
    assert _error([{"root": str(lj), "format": "ljspeech"}]) == (
        f"{lj / 'wavs'}: cannot list the audio folder (Not a directory)")
    vctk = make_vctk(tmp_path / "vctk", trimmed=False)
    txt = vctk / "txt" / "p225" / "p225_001.txt"
    txt.write_bytes("Please call Stella.".encode("utf-16"))
    assert _error([{"root": str(vctk), "format": "vctk"}]) == (
        f"{txt}: UTF-16 (it starts with a UTF-16 byte order mark); save it as UTF-8")


def _unprivileged():
    """The command prefix that runs a process without root's power to read any file (as a user's own
    process is), or None where that cannot be had."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search"
    return [setpriv, "--bounding-set", caps, "--inh-caps", caps]


@pytest.mark.skipif(_unprivileged() is None, reason="running as root without setpriv")
def test_folders_and_tables_the_user_cannot_read_are_one_line_not_clips_left_out(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT
    vctk = make_vctk(tmp_path / "vctk", trimmed=False)
    lj = _ljspeech(tmp_path / "lj")
    code = ("import json, sys\nfrom pipeline import formats\n"
            "try:\n    print(len(formats.read_sources(json.loads(sys.argv[1]))))\n"
            "except formats.DatasetError as e:\n    print(e)\n")

    def read(path, mode, source):
        os.chmod(path, mode)
        try:
            proc = subprocess.run([*_unprivileged(), sys.executable, "-c", code, json.dumps([source])], cwd=ROOT,
                                  capture_output=True, text=True, timeout=120)
        finally:
            os.chmod(path, 0o755)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip()

    import json
    # a speaker's transcript folder it cannot list: its clips were left out without a word (Path.glob)
    assert read(vctk / "txt" / "p226", 0o311, {"root": str(vctk), "format": "vctk"}) == (
        f"{vctk / 'txt' / 'p226'}: cannot list the folder (Permission denied)")
    assert read(lj / "metadata.csv", 0, {"root": str(lj), "format": "ljspeech"}) == (
        f"{lj / 'metadata.csv'}: cannot read it (Permission denied)")
    assert read(lj / "wavs", 0o311, {"root": str(lj), "format": "ljspeech"}) == (
        f"{lj / 'wavs'}: cannot list the audio folder (Permission denied)")
    assert read(lj / "wavs", 0o755, {"root": str(lj), "format": "ljspeech"}) == "2"  # the control: readable


def test_one_speaker_in_two_unicode_spellings_is_refused_naming_both_rows(tmp_path):
    # "José" typed on Linux (NFC) in one source and on macOS (NFD) in another look the same everywhere,
    # and the speaker table held two speakers, each trained on part of one voice
    nfc, nfd = "Jos\u00e9", "Jose\u0301"
    one = make_csv(tmp_path / "one", [f"a1.wav|Hello.|{nfc}|en-us"])
    two = make_csv(tmp_path / "two", [f"b1.wav|Hello.|{nfd}|en-us"])
    message = _error([{"root": str(one), "format": "csv"}, {"root": str(two), "format": "csv"}])
    assert message.startswith(f"{two / 'metadata.csv'}:2: speaker {nfd!r} is {nfc!r} ({one / 'metadata.csv'}:2) "
                              "spelled with other Unicode code points"), message
    same = make_csv(tmp_path / "same", [f"c1.wav|Hello.|{nfc}|en-us"])   # one spelling twice: one speaker
    clips = formats.read_sources([{"root": str(one), "format": "csv"}, {"root": str(same), "format": "csv"}])
    assert {c.speaker for c in clips} == {nfc}
