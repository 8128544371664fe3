"""`python -m pipeline.speak` and pipeline/voice.py on a real exported voice (conftest's exported_voice):
sentence splitting that never reaches max_frames, markup through the voice, raw PCM streamed sentence by
sentence in order, a wav file, one-line errors, and the command run with the training modules unimportable."""
import json
import os
import subprocess
import sys
import textwrap
import time
import wave

import numpy as np
import pytest
from conftest import ROOT

from pipeline import markup
from pipeline.voice import Voice, VoiceError, split_symbols
from pipeline.wavfile import limit_peaks, to_pcm

# what neither speak nor serve may import: training, data, models, vocoders, caches, export, config, Snakemake
BLOCKED = ("pipeline.train", "pipeline.data", "pipeline.models", "pipeline.vocoder", "pipeline.cache",
           "pipeline.export", "pipeline.synthesize", "pipeline.config", "pipeline.align", "pipeline.durations",
           "pipeline.evaluate", "pipeline.runinfo", "snakemake", "librosa", "soundfile", "matplotlib", "yaml")
# what a usage error, or a voice folder whose files are wrong, is said without: TensorFlow's ~6 CPU s start-up
BEFORE_THE_MODEL = (*BLOCKED, "tensorflow", "keras")
LONG = ("the quick brown fox jumps over the lazy dog and then runs far away into the dark green forest where "
        "nobody has ever seen it again since that long and strange summer day")


def blocked_command(module, *args, blocked=BLOCKED):
    """argv of a Python process that runs `python -m module args` with `blocked` unimportable."""
    code = textwrap.dedent(f"""
        import runpy, sys
        for name in {blocked!r}:
            sys.modules[name] = None          # `import name` now raises ImportError
        sys.argv = [{module!r}, *{list(args)!r}]
        runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
    """)
    return [sys.executable, "-c", code]


def child_env():
    return dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def voice(exported_voice):
    return Voice(exported_voice)


@pytest.fixture(autouse=True)
def graph_optimizer_restored():
    """speak.main turns Grappler off for its whole process (voice.quick_start). The tests here that
    call it in this process put the setting back as it was, for the test files this worker runs next."""
    import tensorflow as tf
    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    yield
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


def recorded_calls(voice, monkeypatch):
    """Record (symbols, samples) of every graph call the voice makes (the calls themselves are real)."""
    calls, call = [], voice._call

    def recording(symbols, *args):
        audio = call(symbols, *args)
        calls.append((symbols, len(audio)))
        return audio
    monkeypatch.setattr(voice, "_call", recording)
    return calls


def test_each_stretch_of_speech_fades_in_and_out_and_keeps_its_middle(voice, monkeypatch):
    # the demo-size voice started "Ah." at 0.27 on its first sample: a click after silence or another sentence
    from pipeline.voice import FADE_SECONDS
    calls = []
    call = voice._call
    monkeypatch.setattr(voice, "_call", lambda *a: calls.append(call(*a)) or calls[-1])
    n, edges = round(FADE_SECONDS * voice.sample_rate), []
    for text in ("Ah.", '<speak>It was <break time="200ms"/> late.</speak>'):
        calls.clear()
        made = list(voice.sentences_float(voice.prepare(text)))[0]
        pause = int(round(0.2 * voice.sample_rate)) if "break" in text else 0
        raw = [np.concatenate([c, np.zeros(pause, np.float32)]) if i == 0 and pause else c
               for i, c in enumerate(calls)]
        assert len(calls) == (2 if pause else 1) and len(made) == sum(len(r) for r in raw)
        at = 0
        for chunk, stretch in zip(calls, raw):
            got = made[at:at + len(chunk)]
            np.testing.assert_array_equal(got[n:-n], chunk[n:-n])                # the middle as the graph made it
            assert np.all(np.abs(got[:n]) <= np.abs(chunk[:n])) and np.all(np.abs(got[-n:]) <= np.abs(chunk[-n:]))
            assert abs(got[0]) < 1e-3 * max(abs(chunk[0]), 1e-3) and abs(got[-1]) < 1e-3 * max(abs(chunk[-1]), 1e-3)
            at += len(stretch)
            edges += [abs(chunk[0]), abs(chunk[-1])]
    assert max(edges) > 1e-2                                     # the graph's speech does start or end mid-wave


def test_split_symbols_prefers_clauses_then_words():
    assert split_symbols("ab cd, ef gh; ij", 9) == ["ab cd,", "ef gh; ij"]
    assert split_symbols("ab cd, ef gh; ij", 8) == ["ab cd,", "ef gh;", "ij"]
    assert split_symbols("ab cd ef gh ij kl", 8) == ["ab cd ef", "gh ij kl"]
    assert split_symbols("abcdefghij", 4) == ["abcd", "efgh", "ij"]            # one word over the limit
    assert split_symbols("short one", 40) == ["short one"]


def test_a_long_sentence_is_never_cut_at_max_seconds(voice, monkeypatch):
    max_samples = voice.max_samples
    whole = voice._call(voice.prepare(LONG).sentences[0][0][1], 1.0, 0.0, {})
    assert len(whole) == max_samples                   # said in one call, the graph cuts it at max_frames
    calls = recorded_calls(voice, monkeypatch)
    request = voice.prepare(LONG + ", and so on, for ever and ever.")
    audio = voice.audio(request)
    assert len(calls) >= 3 and all(n < max_samples for _, n in calls)       # no call reached max_frames
    assert len(audio) == sum(n for _, n in calls) > 2 * max_samples          # all of it, longer than the limit
    assert " ".join(s for s, _ in calls) == request.sentences[0][0][1]      # every symbol, once, in order
    assert calls[-2][0].endswith(",")                                       # split after a clause first
    calls.clear()
    monkeypatch.setattr(voice, "_sps", 0.001)          # an estimate far too short: the whole sentence is cut ...
    audio_again = voice.audio(voice.prepare(LONG))
    said = [n for _, n in calls if n < max_samples]
    assert calls[0][1] == max_samples and len(said) >= 4                      # ... and said again in halves
    assert len(audio_again) == sum(said) > 2 * max_samples


def test_markup_through_the_voice(voice, monkeypatch):
    sr = voice.sample_rate
    calls = recorded_calls(voice, monkeypatch)
    plain = voice.audio(voice.prepare("Hello there."))
    paused = voice.audio(voice.prepare('<speak>Hello <break time="500ms"/> there.</speak>'))
    assert len(paused) == pytest.approx(len(plain) + 0.5 * sr, abs=60 * 256)  # the break's silence, ~ +0.5 s
    slow = voice.audio(voice.prepare('<speak><prosody rate="50%" pitch="+3st">Hello there.</prosody></speak>'))
    np.testing.assert_array_equal(slow, voice.audio(voice.prepare("Hello there.", pace=0.5, pitch_shift=3.0)))
    assert len(slow) > 1.3 * len(plain)
    calls.clear()
    voice.audio(voice.prepare("Say [[ təmˈɑːtoʊ ]]. Then more."))
    assert calls[0][0].endswith(" təmˈɑːtoʊ") and len(calls) == 2            # the symbols as they are
    with pytest.raises(VoiceError, match=r"line 1, column 5: phoneme\(s\) Q Ж not in this voice's symbols .*: a b c"):
        voice.prepare("Say [[ QЖ ]]")
    with pytest.raises(markup.MarkupError, match="line 1, column 8: <audio> is not in the supported subset"):
        voice.prepare("<speak><audio src='x'/></speak>")
    for bad in ({"pace": float("nan")}, {"pace": -1.0}, {"pace": 100.0}, {"pitch_shift": float("inf")},
                {"speaker": "nobody"}, {"language": "xx"}):
        with pytest.raises(VoiceError, match=f"^{next(iter(bad))}: "):
            voice.prepare("Hello.", **bad)
    with pytest.raises(VoiceError, match=r"^line 1, column 29: pace 3 x prosody rate 2: 6.0 is outside 0.25..4$"):
        voice.prepare('<speak><prosody rate="200%">fast</prosody></speak>', pace=3.0)


def test_raw_streams_each_sentence_as_it_is_ready_without_the_training_modules(voice, exported_voice):
    first, second = "Hello there. How are you today?", "Fine, thank you."
    expected = [to_pcm(limit_peaks(voice.sentence_float(s, {}), voice.sample_rate))
                for text in (first, second) for s in voice.prepare(text).sentences]
    proc = subprocess.Popen(blocked_command("pipeline.speak", "--voice", str(exported_voice), "--raw"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(),
                            cwd=ROOT)
    try:
        proc.stdin.write(f"{first}\n\n".encode())
        proc.stdin.flush()                 # the second paragraph is not written yet: the first must come out
        head = read_exactly(proc.stdout, 2 * (len(expected[0]) + len(expected[1])))
        proc.stdin.write(f"{second}\n".encode())
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-3000:]
    finally:
        proc.kill()
    got = np.frombuffer(head + rest, "<i2")
    pause = np.zeros(int(markup.PARAGRAPH_PAUSE * voice.sample_rate), np.int16)
    want = np.concatenate([expected[0], expected[1], pause, expected[2]])
    assert len(got) == len(want) and np.abs(got.astype(int) - want).max() <= 2   # the sentences, in order
    assert "3 sentence(s)" in proc.stderr.read().decode()                     # logs on stderr, not stdout


def read_exactly(stream, n, timeout=120):
    out, t0 = b"", time.monotonic()
    while len(out) < n:
        chunk = stream.read1(n - len(out))
        assert chunk, f"the stream ended after {len(out)} of {n} bytes"
        assert time.monotonic() - t0 < timeout
        out += chunk
    return out


def test_wav_file_and_one_line_errors(voice, exported_voice, tmp_path, capsys):
    from pipeline import speak
    out = tmp_path / "said.wav"
    speak.main(["--voice", str(exported_voice), "--out", str(out), "--pace", "1.2", "Hello there.", "Goodbye."])
    with wave.open(str(out)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (voice.sample_rate, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    want = voice.audio(voice.prepare("Hello there. Goodbye.", pace=1.2))
    assert len(pcm) == len(want) and np.abs(pcm.astype(int) - want).max() <= 2 and np.abs(pcm).max() > 0
    err = capsys.readouterr().err
    assert "wrote" in err
    # no GPU here: the voice ran without Grappler, and said the same to 2 LSB (above)
    assert "Hz; CPU, graph optimizer off)" in err
    import tensorflow as tf
    assert tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"] is True
    for argv, message in ((["--out", str(tmp_path / "x.wav"), "--ssml", "<speak>hi"],
                           "line 1, column 10: invalid SSML: no element found"),
                          (["--out", str(tmp_path / "x.wav"), "--pace", "nan", "Hello."], "--pace: nan is outside 0.25..4"),
                          # --out is checked before the voice loads: not after the work, not beside its parent
                          (["--out", str(tmp_path), "Hello."], f"--out {tmp_path}: a folder; give the path of the .wav"),
                          (["--out", str(tmp_path / "said.wav/x.wav"), "Hello."], f"{out} is a file, not a folder")):
        with pytest.raises(SystemExit) as exit_:
            speak.main(["--voice", str(exported_voice), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and err[-1].startswith("error: ") and message in err[-1], err
    assert not (tmp_path / "x.wav").exists() and sorted(os.listdir(tmp_path)) == ["said.wav"]
    assert not list(tmp_path.parent.glob(f".{tmp_path.name}*"))             # nothing written beside the folder
    speak.main(["--voice", str(exported_voice), "--out", str(tmp_path / "new/sub/x.wav"), "Hi."])  # folders made
    assert (tmp_path / "new/sub/x.wav").stat().st_size > 44 and os.listdir(tmp_path / "new/sub") == ["x.wav"]
    with pytest.raises(SystemExit):                                       # a folder that is not an export
        speak.main(["--voice", str(tmp_path / "new"), "--out", str(tmp_path / "x.wav"), "Hello."])
    assert f"{tmp_path / 'new' / 'export.json'}: not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):                                       # --out inside the voice: refused first
        speak.main(["--voice", str(tmp_path / "new"), "--out", str(tmp_path / "new" / "x.wav"), "Hello."])
    assert "which this command reads; write the output elsewhere" in capsys.readouterr().err


def test_loud_audio_is_limited_to_a_095_peak_not_clipped_the_same_in_out_and_raw(voice, exported_voice, tmp_path,
                                                                                   monkeypatch):
    # speak clipped every sample over 1 to +-32767 (voice.to_int16); then --out scaled the whole utterance
    # to a 0.95 peak and --raw each sentence, so the two differed. Now each sentence's peaks are limited
    # (wavfile.limit_peaks) and --out holds the very samples --raw sends
    import io
    from types import SimpleNamespace

    from pipeline import speak
    call = Voice._call
    monkeypatch.setattr(Voice, "_call", lambda self, *a: 4.0 * call(self, *a))   # every sentence's peak over 1
    text, peak = "Hello there. Goodbye.", 0.95 * 32768
    speak.main(["--voice", str(exported_voice), "--out", str(tmp_path / "loud.wav"), text])
    with wave.open(str(tmp_path / "loud.wav")) as w:
        wav = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(int)
    assert np.abs(wav).max() == pytest.approx(peak, abs=1)                   # no run of samples stuck at 32767
    stdout = io.BytesIO()
    speak.speak(voice, [(1, text)], SimpleNamespace(ssml=False, pace=1.0, pitch_shift=0.0, speaker=None,
                                                     language=None), stdout)   # what --raw writes
    raw = np.frombuffer(stdout.getvalue(), "<i2").astype(int)
    said = list(voice.sentences_float(voice.prepare(text)))
    monkeypatch.setattr(Voice, "_call", call)
    assert len(said) == 2 and min(np.abs(a).max() for a in said) == pytest.approx(0.95, abs=1e-6)   # limited
    parts = np.split(raw, np.cumsum([len(a) for a in said])[:-1])
    assert [np.abs(part).max() for part in parts] == pytest.approx([peak, peak], abs=1)   # each sentence's peaks
    np.testing.assert_array_equal(raw, np.concatenate([to_pcm(a) for a in said]))
    np.testing.assert_array_equal(wav, raw)                               # --out: the samples --raw sent


def test_voice_description(voice, exported_voice):
    meta = json.loads((exported_voice / "export.json").read_text())
    assert voice.describe() == {"speakers": meta["speakers"], "languages": meta["languages"],
                                "sample_rate": meta["sample_rate"]}


def test_a_bad_out_is_one_line_before_the_voice_loads_and_a_failed_write_too(exported_voice, tmp_path, capsys,
                                                                              monkeypatch):
    from pipeline import speak

    def run(*argv, lines=1):
        """The error line of `speak ARGV`: stderr's last, after `lines - 1` log lines."""
        with pytest.raises(SystemExit) as exit_:
            speak.main(["--voice", str(exported_voice), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == lines and err[-1].startswith("error: "), err
        return err[-1]

    with monkeypatch.context() as m:   # refused before the voice loads: loading it is a failure here
        m.setattr(speak, "Voice", lambda *a, **k: pytest.fail("the voice loaded before --out was checked"))
        assert "--out: an empty path" in run("--out", "", "Hello.")
        # both wrote a file: "new" (Path() drops the "/") and "-" in the working folder
        new = str(tmp_path / "new") + os.sep
        assert run("--out", new, "Hello.") == f"error: --out {new}: a folder (a path ending in {os.sep}, . or ..); " \
            "give the path of the .wav to write"
        assert run("--out", "-", "Hello.") == "error: --out -: a wav goes to a file; give its path (./- for a file " \
            "named -), or --raw for PCM on standard output"
        if os.path.isdir("/proc/self"):   # a folder that passes a permission check but takes no new file
            assert run("--out", "/proc/x.wav", "Hello.").startswith("error: --out /proc/x.wav: cannot write in /proc")
        # the pitch shift and the markup of TEXT are checked before the voice loads too, not after
        assert run("--out", str(tmp_path / "x.wav"), "--pitch-shift", "13", "Hello.") == \
            "error: --pitch-shift: 13.0 is outside -12..12"
        assert run("--out", str(tmp_path / "x.wav"), "--ssml", "<speak>hi") == \
            "error: line 1, column 10: invalid SSML: no element found"
    assert not list(tmp_path.iterdir())
    from pipeline import voice
    with monkeypatch.context() as m:   # a speaker or language the voice lacks: refused from export.json, unloaded
        m.setattr(voice.Voice, "_load", lambda *a: pytest.fail("the model loaded before --speaker was checked"))
        out = str(tmp_path / "x.wav")
        assert run("--out", out, "--speaker", "bob", "Hello.").startswith("error: speaker: unknown speaker 'bob'; this "
                                                                          "voice's speakers: ")
        assert run("--out", out, "--language", "fr", "Hello.").startswith("error: language: unknown language 'fr'; this voice's "
                                                           "languages: ")

    def refused(path, blocks, sample_rate, where):
        raise PermissionError(13, "Permission denied", str(path))
    monkeypatch.setattr(speak, "stream_pcm", refused)   # the folder changed while the voice spoke
    out = tmp_path / "x.wav"                              # (after the voice's one log line)
    assert run("--out", str(out), "Hello.", lines=2) == f"error: --out {out}: cannot write it (Permission denied)"


def test_a_symbolic_link_loop_in_out_is_one_line_before_the_voice_loads(tmp_path):
    # `ln -s loop loop; speak --out loop/x.wav`: the check passed, the voice loaded and spoke, and the
    # write failed with a traceback; a --out linked to itself was replaced by a file (TensorFlow is
    # unimportable in these processes, and the voice folder is not there)
    os.symlink("loop", tmp_path / "loop")
    os.symlink("self.wav", tmp_path / "self.wav")
    for given, said in (("loop/x.wav", "loop is"), ("self.wav", "it is")):
        proc = subprocess.run(blocked_command("pipeline.speak", "--voice", "no/such/export", "--out", given, "Hello.",
                                              blocked=BEFORE_THE_MODEL),
                              capture_output=True, text=True, env=child_env(), cwd=tmp_path, timeout=300)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"error: --out {given}: {said} a symbolic link that leads back to itself; give the path of the .wav to "
            "write"], proc.stderr[-3000:]
    assert sorted(os.listdir(tmp_path)) == ["loop", "self.wav"] and os.path.islink(tmp_path / "self.wav")


def test_out_is_written_as_it_is_said_and_renamed_onto_it_when_all_is_said(exported_voice, tmp_path, capsys,
                                                                            monkeypatch):
    # --out held all of the text's audio in memory and wrote it at the end (~7 GB for an 8-hour book):
    # now each sentence is appended to a temporary file beside --out as it is made, the older --out kept
    # until the rename; the same bytes as before (to_pcm of all the chunks) and as --raw's PCM; a later
    # sentence that fails, or audio past what a wav holds (4 GiB), leaves --out as it was and no temporary file
    import io
    from types import SimpleNamespace

    from pipeline import files, speak, wavfile
    out, text = tmp_path / "book.wav", "Hello there. How are you?\n\nFine, thank you.\n\nGoodbye now.\n"
    out.write_bytes(b"RIFF an older take")
    tmp, seen, made, sentences = files.temporary(out), [], [], Voice.sentences_float

    def watched(self, request):   # before each sentence is written: the temporary file and --out
        for audio in sentences(self, request):
            seen.append((tmp.stat().st_size if tmp.exists() else None, out.read_bytes()))
            yield audio
    monkeypatch.setattr(Voice, "sentences_float", watched)
    monkeypatch.setattr(speak, "Voice", lambda *a, **k: made.append(Voice(*a, **k)) or made[-1])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))
    speak.main(["--voice", str(exported_voice), "--out", str(out)])
    assert f"wrote {out}: 4 sentence(s)" in capsys.readouterr().err
    sizes = [size for size, _ in seen]
    assert sizes[0] is None and 44 < sizes[1] < sizes[2] < sizes[3], sizes       # the sentences before on disk
    assert {old for _, old in seen} == {b"RIFF an older take"} and os.listdir(tmp_path) == ["book.wav"]
    monkeypatch.setattr(Voice, "sentences_float", sentences)
    voice, args = made[0], SimpleNamespace(ssml=False, pace=1.0, pitch_shift=0.0, speaker=None, language=None)
    chunks = list(speak.said(voice, speak.paragraphs(io.StringIO(text)), args, False, True))
    raw = io.BytesIO()
    assert speak.speak(voice, speak.paragraphs(io.StringIO(text)), args, raw, True)[0] == 4
    wav = out.read_bytes()
    assert wav == wavfile.wav_bytes(to_pcm(chunks), voice.sample_rate)           # what --out wrote before
    assert wav == wavfile.wav_bytes(np.frombuffer(raw.getvalue(), "<i2"), voice.sample_rate)   # --raw's PCM
    # the third sentence's audio is NaN: two are written, then --out is left as it was
    monkeypatch.setattr(Voice, "sentences_float", lambda self, request: (
        a if i else np.full(10, np.nan, np.float32) for i, a in enumerate(sentences(self, request))))
    assert speak_error(exported_voice, text.encode(), capsys, monkeypatch, "--out", str(out)) == \
        f"error: --out {out}: the audio has NaN or infinite samples; nothing written"
    assert out.read_bytes() == wav and os.listdir(tmp_path) == ["book.wav"]
    monkeypatch.setattr(Voice, "sentences_float", sentences)
    monkeypatch.setattr(wavfile, "MAX_DATA", len(wav) - 44 - 2)   # one sample short of this text's audio
    assert speak_error(exported_voice, text.encode(), capsys, monkeypatch, "--out", str(out)).startswith(
        f"error: --out {out}: the audio passes 4 GiB, the most a wav holds (about ")
    assert out.read_bytes() == wav and os.listdir(tmp_path) == ["book.wav"]


def test_out_stopped_by_a_signal_leaves_it_as_it_was_and_no_temporary_file(exported_voice, tmp_path):
    # --out now writes as it speaks: SIGTERM (`kill`, `timeout`) and Ctrl-C mid-book must not leave a
    # temporary file of gigabytes beside it, nor touch the older --out
    import signal
    out = tmp_path / "book.wav"
    out.write_bytes(b"RIFF an older take")
    book = "\n\n".join(f"Paragraph {i}, where nothing much happens at all." for i in range(400)).encode()
    for sign, status, said in ((signal.SIGTERM, 128 + signal.SIGTERM, f"stopped (SIGTERM); --out {out} not written"),
                               (signal.SIGINT, 130, "stopped (Ctrl-C)")):
        proc = subprocess.Popen(blocked_command("pipeline.speak", "--voice", str(exported_voice), "--out", str(out)),
                                stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT)
        try:
            proc.stdin.write(book)
            proc.stdin.close()
            tmp, t0 = tmp_path / f".book.wav.tmp{proc.pid}", time.monotonic()
            while not (tmp.exists() and tmp.stat().st_size > 44):   # some sentences written
                assert proc.poll() is None and time.monotonic() - t0 < 120, proc.stderr.read().decode()[-3000:]
                time.sleep(0.05)
            proc.send_signal(sign)
            err = proc.stderr.read().decode()
            assert proc.wait(timeout=60) == status and "Traceback" not in err, err[-3000:]
        finally:
            proc.kill()
        assert err.strip().splitlines()[-1] == said
        assert out.read_bytes() == b"RIFF an older take" and os.listdir(tmp_path) == ["book.wav"]


def speak_error(exported_voice, stdin, capsys, monkeypatch, *argv):
    """The last stderr line of `speak --voice V ARGV` reading `stdin` (bytes), which must fail with status 2."""
    import io

    from pipeline import speak
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    with pytest.raises(SystemExit) as exit_:
        speak.main(["--voice", str(exported_voice), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err
    return err[-1]


def test_a_nul_in_the_text_is_refused_not_the_rest_of_the_sentence_dropped(exported_voice, tmp_path, capsys,
                                                                           monkeypatch):
    # espeak-ng stopped at the NUL: only "Hello there." was said, and speak answered 0
    where = ["--out", str(tmp_path / "nul.wav")]
    assert speak_error(exported_voice, b"Hello there. \0How are you today?", capsys, monkeypatch, *where) == \
        ("error: line 1, column 14: control character U+0000 is not plain text; remove it (the front end would "
         "stop or split a word there)")
    assert not (tmp_path / "nul.wav").exists()


def run_speak(exported_voice, stdin, *argv, **env):
    """(exit status, standard output bytes, last standard error line) of `speak --voice V ARGV` as a process."""
    proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(exported_voice), *argv), input=stdin,
                          capture_output=True, env=dict(child_env(), **env), cwd=ROOT, timeout=300)
    err = proc.stderr.decode().strip().splitlines()
    assert "Traceback" not in proc.stderr.decode(), err[-20:]
    return proc.returncode, proc.stdout, err[-1] if err else ""


def test_raw_refuses_text_that_says_nothing_and_passes_over_a_quiet_paragraph(voice, exported_voice):
    # --raw answered 0 with 2 s of zeros for a break alone (without --raw it was already the error)
    assert run_speak(exported_voice, b"", "--raw", '<speak>... <break time="2s"/></speak>') == \
        (2, b"", """error: '<speak>... <break time="2s"/></speak>': nothing to say""")
    assert run_speak(exported_voice, b"...\n\n. . .\n", "--raw") == (2, b"", "error: '...': nothing to say")
    assert run_speak(exported_voice, b"\n \n", "--raw") == (2, b"", "error: no text to speak (give TEXT or standard input)")
    rc, pcm, _ = run_speak(exported_voice, b"Hello.\n\n...\n\nGoodbye.\n", "--raw")    # a quiet paragraph
    pause = np.zeros(int(markup.PARAGRAPH_PAUSE * voice.sample_rate), np.int16)
    want = np.concatenate([voice.audio(voice.prepare("Hello.")), pause, voice.audio(voice.prepare("Goodbye."))])
    got = np.frombuffer(pcm, "<i2")
    assert rc == 0 and len(got) == len(want) and np.abs(got.astype(int) - want).max() <= 2


def test_a_long_sentence_costs_the_front_end_linear_time_and_says_the_same(voice):
    # phonemizer keeps punctuation by splitting and joining a whole call's text at each mark: five
    # sentences of 20,000 characters of "a." (100 kB) took 14 s of CPU before their 413
    from pipeline import text
    from pipeline.voice import TooLong
    t0 = time.process_time()
    with pytest.raises(TooLong, match="^sentence 1: over the 600 s of audio one sentence may make"):
        voice.prepare(("a." * 9999 + "! ") * 5, max_seconds=600.0)
    assert time.process_time() - t0 < 5
    # a long sentence goes through the front end in pieces cut where phonemizer cuts it: the same symbols
    from pipeline.voice import front_end_pieces
    long = ", ".join(f"Mr. Smith paid $5.50 (not 1,000) on the {n}th day; really? yes… “quite” so" for n in range(40))
    cfg = {k: voice.vocab[k] for k in ("frontend", "language", "cleaners")}
    assert len(front_end_pieces(long, cfg["cleaners"])) > 2
    assert voice._front_end([long], cfg["language"]) == [text.to_symbols([long], cfg)[0][0]]


def test_a_word_longer_than_espeak_reads_is_said_whole_in_parts(voice):
    # espeak-ng stopped reading a word after ~130 letters (~40 spelled letter by letter) and said
    # nothing of the rest: a 183-letter word lost its last 20 letters, "x" * 80 half of its x's
    from pipeline import text
    from pipeline.text import LONGEST_WORD, cut_long_words
    cfg = {k: voice.vocab[k] for k in ("frontend", "language", "cleaners")}
    language = cfg["language"]
    for word, n in (("tomato", 40), ("x", 80), ("bcd", 30)):
        long, half = word * n, word * (n // 2)
        said = voice._front_end([f"Say {long} now."], language)[0]
        assert said == text.to_symbols([f"Say {cut_long_words(long)} now."], cfg)[0][0]
        whole = len(voice._front_end([long], language)[0])
        assert whole >= 1.9 * len(voice._front_end([half], language)[0]), (word, whole)  # every part said
    assert all(len(part) <= LONGEST_WORD for part in cut_long_words("a" * 1000 + " b").split())
    # words up to LONGEST_WORD letters and long numbers are read as they were
    for line in ("Supercalifragilisticexpialidocious!", "It is 123456789012345678901234567890123456789 exactly."):
        assert cut_long_words(line) == line and voice._front_end([line], language) == [text.to_symbols([line], cfg)[0][0]]


def test_standard_input_that_is_not_utf8_is_one_line_naming_the_byte(voice, exported_voice, tmp_path, capsys,
                                                                     monkeypatch):
    # a UnicodeDecodeError traceback under a strict UTF-8 locale
    assert speak_error(exported_voice, b"Hello \xe9t\xe9 there.", capsys, monkeypatch, "--out", str(tmp_path / "x.wav")) \
        == "error: standard input, line 1: byte 0xe9 at byte offset 6 is not UTF-8; give the text in UTF-8"
    rc, pcm, err = run_speak(exported_voice, b"Hello there.\n\nOK \xe9t\xe9.\n", "--raw",
                             PYTHONIOENCODING="utf-8:strict")             # read a paragraph at a time
    assert (rc, err) == (2, "error: standard input, line 3: byte 0xe9 at byte offset 17 is not UTF-8; give the text "
                            "in UTF-8")
    assert len(pcm) == 2 * len(voice.audio(voice.prepare("Hello there.")))   # the paragraph before it was said


def test_raw_and_out_read_the_same_standard_input_the_same_way(voice, exported_voice, tmp_path, capsys, monkeypatch):
    # --raw read the second paragraph as SSML (1 s of silence), --out all of it as plain text (the tags aloud)
    import io

    from pipeline import speak
    mixed = b'Hello there.\n\n<speak>Hi <break time="1s"/> there.</speak>\n'
    rc, pcm, err = run_speak(exported_voice, mixed, "--raw")
    assert rc == 0 and err.startswith("2 sentence(s)"), err
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(mixed), encoding="utf-8"))
    speak.main(["--voice", str(exported_voice), "--out", str(tmp_path / "mixed.wav")])
    assert "wrote " + str(tmp_path / "mixed.wav") + ": 2 sentence(s)" in capsys.readouterr().err
    with wave.open(str(tmp_path / "mixed.wav")) as w:
        wav = np.frombuffer(w.readframes(w.getnframes()), "<i2")
    pause = np.zeros(int(markup.PARAGRAPH_PAUSE * voice.sample_rate), np.float32)
    said = [*voice.sentences_float(voice.prepare("Hello there.")), pause,
            *voice.sentences_float(voice.prepare('<speak>Hi <break time="1s"/> there.</speak>'))]
    raw = np.concatenate([to_pcm(a) for a in said])   # each sentence as sentences_float gives it (peaks limited)
    for got in (np.frombuffer(pcm, "<i2"), wav):      # --raw and --out
        assert len(got) == len(raw) and np.abs(got.astype(int) - raw).max() <= 2


def test_standard_input_saved_with_a_byte_order_mark_is_read_as_without_it(exported_voice, tmp_path, monkeypatch):
    # a file saved with a BOM before its "<speak>" is still one SSML document, blank lines and all: read a
    # paragraph at a time, its first paragraph alone was taken as the document ("no element found")
    import io

    from pipeline import speak
    document = '<speak>\nHello there.\n\n<break time="1s"/> Goodbye.</speak>\n'
    said = []
    for name, text in (("plain.wav", document), ("bom.wav", markup.BOM + document)):
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))
        speak.main(["--voice", str(exported_voice), "--out", str(tmp_path / name)])
        with wave.open(str(tmp_path / name)) as w:
            said.append(np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(int))
    assert len(said[0]) == len(said[1]) and np.abs(said[0] - said[1]).max() <= 2


def test_errors_name_lines_of_the_whole_input_read_a_paragraph_at_a_time(exported_voice, tmp_path, capsys,
                                                                         monkeypatch):
    # --raw named the line in its paragraph ("line 2"); --out, reading paragraphs too now, must not either
    text = b"Hello there.\n\nOne more\n[[ a [[ b ]].\n"
    message = "error: line 4, column 6: '[[' inside phonemes opened at line 4, column 1"
    assert speak_error(exported_voice, text, capsys, monkeypatch, "--out", str(tmp_path / "x.wav")) == message
    rc, pcm, err = run_speak(exported_voice, text, "--raw")
    assert (rc, err) == (2, message) and pcm                                   # after the paragraph before it
    assert not list(tmp_path.iterdir())
    # a sentence the front end cannot say has no column of its own: its paragraph's first line
    line = speak_error(exported_voice, "Hello there.\n\nOne more\nsay \u263a here.\n".encode(), capsys, monkeypatch,
                       "--out", str(tmp_path / "x.wav"))
    assert line.startswith("error: the paragraph at line 3: ") and "\u263a" in line, line
    # an SSML document is no paragraph (its first line is <speak>): not named so
    for text, ssml in (("Hello there.\n\n<speak>\nOne more\nsay \u263a here.</speak>\n", []),
                       ("<speak>\nOne more\nsay \u263a here.</speak>\n", ["--ssml"])):
        line = speak_error(exported_voice, text.encode(), capsys, monkeypatch, "--out", str(tmp_path / "x.wav"), *ssml)
        assert "paragraph" not in line and "\u263a" in line, line
    # a paragraph after a blank first line: its lines counted from the input's first
    assert speak_error(exported_voice, b"\nOne more\n[[ a [[ b ]].\n", capsys, monkeypatch, "--out",
                       str(tmp_path / "x.wav")) == "error: line 3, column 6: '[[' inside phonemes opened at line 3, column 1"


def test_raw_names_the_paragraph_of_a_later_sentence_the_front_end_cannot_say(exported_voice):
    # --raw reads a paragraph's later sentences through the front end as they come: one it could not say
    # was named by its text alone ("error: 'Then ☺ here.': ..."), where --out named its paragraph's line
    rc, pcm, err = run_speak(exported_voice, "Hello there.\n\nFine.\nThen \u263a here.\n".encode(), "--raw")
    assert rc == 2 and pcm and err.startswith("error: the paragraph at line 3: 'Then \u263a here.'"), err


def test_out_is_left_as_it_was_when_the_text_is_refused_and_standard_input_is_not_needed(exported_voice, tmp_path,
                                                                                          capsys, monkeypatch):
    # --out is written atomically once all is said: text refused before the voice loads or after it
    # (a later paragraph) makes none of a new path's folders and leaves an older file whole
    from pipeline import speak
    kept, new = tmp_path / "kept.wav", tmp_path / "new" / "sub" / "x.wav"
    kept.write_bytes(b"RIFF an older take")
    speak_error(exported_voice, b"", capsys, monkeypatch, "--out", str(new), "--ssml", "<speak>hi")
    speak_error(exported_voice, "Hello there.\n\nsay \u263a here.\n".encode(), capsys, monkeypatch, "--out", str(kept))
    assert kept.read_bytes() == b"RIFF an older take" and os.listdir(tmp_path) == ["kept.wav"]
    monkeypatch.setattr(sys, "stdin", None)   # `speak ... TEXT <&-`: TEXT is said, standard input not wanted
    speak.main(["--voice", str(exported_voice), "--out", str(kept), "Hi."])
    with wave.open(str(kept)) as w:
        assert w.getnframes() > 0


def test_out_checks_all_of_the_text_before_it_makes_any_audio(exported_voice, tmp_path, capsys, monkeypatch):
    # without --raw nothing is heard before all is said: a sentence the front end cannot say, in the last
    # paragraph of standard input or the last sentence of TEXT, is refused before any audio is made
    monkeypatch.setattr(Voice, "sentences_float", lambda *a: pytest.fail("audio made before all the text was checked"))
    out = ["--out", str(tmp_path / "x.wav")]
    line = speak_error(exported_voice, "Hello there.\n\nsay \u263a here.\n".encode(), capsys, monkeypatch, *out)
    assert line.startswith("error: the paragraph at line 3: ") and "\u263a" in line, line
    line = speak_error(exported_voice, b"", capsys, monkeypatch, *out, "Hello there. Say \u263a here.")
    assert "paragraph" not in line and "\u263a" in line, line                  # TEXT has no paragraphs
    assert not list(tmp_path.iterdir())


def test_arguments_are_checked_before_the_voice_loads(exported_voice, tmp_path, capsys, monkeypatch):
    # one of --out and --raw, and a --pace in range, are known before the model loads
    from pipeline import speak
    monkeypatch.setattr(speak, "Voice", lambda *a, **k: pytest.fail("the voice loaded before the arguments were checked"))
    for argv, message in (([], "one of the arguments --out --raw is required"),
                          (["--raw", "--out", str(tmp_path / "x.wav")], "argument --out: not allowed with argument --raw")):
        with pytest.raises(SystemExit) as exit_:
            speak.main(["--voice", str(exported_voice), *argv, "Hello."])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        speak.main(["--voice", str(exported_voice), "--out", str(tmp_path / "x.wav"), "--pace", "nan", "Hello."])
    assert exit_.value.code == 2 and capsys.readouterr().err.strip() == "error: --pace: nan is outside 0.25..4"
    assert not list(tmp_path.iterdir())


def test_phonemes_and_prosody_given_as_arguments_are_checked_before_tensorflow_loads(exported_voice, tmp_path):
    # a symbol the voice lacks, or a prosody rate that takes --pace out of range, in TEXT was said only
    # after TensorFlow's start-up (~10 s), though vocab.json and the options show it; bytes that are
    # not UTF-8 are said before it too (TensorFlow is unimportable in these processes)
    for argv, message in ((["Say [[ ZZZ ]] now."], "error: line 1, column 5: phoneme(s) Z not in this voice's symbols"),
                          (["--pace", "0.25", '<speak><prosody rate="x-slow">hi</prosody></speak>'],
                           "error: line 1, column 31: pace 0.25 x prosody rate 0.5: 0.125 is outside 0.25..4"),
                          (["caf\udce9"],   # the byte 0xe9 (Latin-1's é) on the command line: not UTF-8
                           "error: argument 'caf\\xe9' is not UTF-8 text (byte 0xe9)")):
        proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(exported_voice), "--out",
                                              str(tmp_path / "x.wav"), *argv, blocked=BEFORE_THE_MODEL),
                              capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(message), proc.stderr[-3000:]
    assert not list(tmp_path.iterdir())


def test_the_seconds_to_the_first_audio_are_the_first_sentences(voice, monkeypatch):
    # --raw logs "first audio after F s": the latency a listener waits, not the time to the last sentence
    import io
    from types import SimpleNamespace

    from pipeline import speak
    clock = [0.0]
    sentences = voice.sentences_float

    def made(request):              # each sentence takes one second on this clock
        for audio in sentences(request):
            clock[0] += 1.0
            yield audio
    args = SimpleNamespace(ssml=False, pace=1.0, pitch_shift=0.0, speaker=None, language=None)
    monkeypatch.setattr(voice, "sentences_float", made)
    monkeypatch.setattr(speak, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    n, first = speak.speak(voice, [(1, "Hello there. How are you? Fine.")], args, io.BytesIO())
    assert (n, first) == (3, 1.0)


def test_with_ssml_standard_input_is_one_document_blank_lines_and_all(exported_voice, tmp_path, monkeypatch):
    # --ssml: all of standard input is one SSML document (its <speak> implied), not read a paragraph at a
    # time: an element may hold a blank line
    import io

    from pipeline import speak
    text = '<prosody rate="50%">Hello there.\n\nGoodbye.</prosody>\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode()), encoding="utf-8"))
    speak.main(["--voice", str(exported_voice), "--out", str(tmp_path / "slow.wav"), "--ssml"])
    with wave.open(str(tmp_path / "slow.wav")) as w:
        assert w.getnframes() > 0



def test_raw_on_a_full_disk_names_standard_output(exported_voice):
    # `speak --raw ... > /dev/full`: "no space left on device writing (a file)"
    argv = blocked_command("pipeline.speak", "--voice", str(exported_voice), "--raw", "Hi there.")
    proc = subprocess.run(["sh", "-c", 'exec "$@" > /dev/full', "sh", *argv], stderr=subprocess.PIPE,
                          env=child_env(), cwd=ROOT, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err and err.strip().splitlines()[-1] == (
        "error: --raw: no space left on device writing standard output; free space and rerun"), err[-3000:]

def test_raw_writes_all_of_what_an_output_takes_a_part_of_at_a_time():
    # standard output unbuffered (a pipe, a socket) may take part of a write: the rest follows, in order
    import io

    from pipeline import speak

    class Partial(io.RawIOBase):
        def __init__(self):
            self.taken = bytearray()

        def writable(self):
            return True

        def write(self, data):
            self.taken += bytes(data[:1000])
            return min(len(data), 1000)
    out, data = Partial(), np.arange(5000, dtype="<i2").tobytes()
    speak.write_raw(out, data)
    assert bytes(out.taken) == data


def test_raw_keeps_a_stray_print_out_of_the_audio(voice, exported_voice):
    # nothing but audio on standard output: a library's print (here one at exit) goes to standard error
    argv = blocked_command("pipeline.speak", "--voice", str(exported_voice), "--raw", "Hi there.")
    argv[-1] = "import atexit\natexit.register(print, 'a stray line')\n" + argv[-1]
    proc = subprocess.run(argv, capture_output=True, env=child_env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    assert len(proc.stdout) == 2 * len(voice.audio(voice.prepare("Hi there.")))
    assert "a stray line" in proc.stderr.decode()


def test_raw_to_a_reader_that_went_away_ends_quietly(exported_voice):
    # `speak --raw ... | head -c 1000`: the reader has what it wanted; no traceback, status 0
    read, write = os.pipe()
    os.close(read)   # the reader is gone before the first sentence
    try:
        proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(exported_voice), "--raw", "Hi there."),
                              stdout=write, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT, timeout=300)
    finally:
        os.close(write)
    err = proc.stderr.decode()
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    assert not [line for line in err.splitlines() if line.startswith("error: ")], err[-3000:]


def test_raw_with_standard_output_closed_is_one_line():
    # `speak --raw ... >&-`: a traceback, AttributeError: 'NoneType' object has no attribute 'flush'
    # (and said before TensorFlow loads: it is unimportable here)
    argv = blocked_command("pipeline.speak", "--voice", "no/such/export", "--raw", "Hi there.", blocked=BEFORE_THE_MODEL)
    proc = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", *argv], stderr=subprocess.PIPE, env=child_env(),
                          cwd=ROOT, timeout=300)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.strip().splitlines() == [
        "error: --raw: standard output is closed; send it to a player, a pipe or a file, or write a wav with "
        "--out F.wav"], err[-3000:]


def test_raw_to_a_terminal_is_one_line_not_screens_of_samples():
    # `speak --raw "Hi."` typed without a pipe wrote the samples to the terminal, as binary it can take
    # for control sequences, and answered 0 (said before TensorFlow loads: it is unimportable here)
    import pty
    argv = blocked_command("pipeline.speak", "--voice", "no/such/export", "--raw", "Hi there.", blocked=BEFORE_THE_MODEL)
    reader, terminal = pty.openpty()
    try:
        proc = subprocess.run(argv, stdout=terminal, stderr=subprocess.PIPE, env=child_env(), cwd=ROOT, timeout=300)
    finally:
        os.close(terminal)
        os.close(reader)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.strip().splitlines() == [
        "error: --raw: standard output is a terminal; send it to a player (| aplay -r RATE -f S16_LE -c 1), a pipe "
        "or a file, or write a wav with --out F.wav"], err[-3000:]
