"""pipeline/voice.py at its edges: a damaged export folder is one line naming it (never a traceback),
and what a request can make the voice do is bounded before the audio is made."""
import json
import shutil
import subprocess

import pytest
from conftest import ROOT
from test_speak import BEFORE_THE_MODEL, blocked_command, child_env

from pipeline.voice import VoiceError


def copy_of(voice, tmp_path, name="voice"):
    return shutil.copytree(voice, tmp_path / name)


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def load(folder, log=None):
    from pipeline.voice import Voice
    return Voice(folder, log=log)


def unverified(folder):
    """export.json as exports wrote it before `format` and `files`."""
    meta = json.loads((folder / "export.json").read_text())
    (folder / "export.json").write_text(json.dumps({k: v for k, v in meta.items() if k not in ("format", "files")}))


def edit_byte(path, at=-1):
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


CHANGED = ("was replaced or changed since it was exported; export the voice again (snakemake --cores all export; "
           "a folder written with --out: python -m pipeline.export --config CONFIG --out DIR)")


@pytest.mark.parametrize("damage, message", [
    (lambda d: shutil.rmtree(d / "saved_model" / "variables"),
     "saved_model/variables/variables.data-00000-of-00001: missing (export.json files): saved_model " + CHANGED),
    (lambda d: (d / "saved_model" / "saved_model.pb").write_bytes(b""), "saved_model/saved_model.pb: 0 bytes, not the"),
    (lambda d: [shutil.rmtree(d / "saved_model"), (d / "saved_model").mkdir()], "saved_model/fingerprint.pb: missing"),
    (lambda d: [unverified(d), shutil.rmtree(d / "saved_model" / "variables")],
     "saved_model: cannot be loaded (FileNotFoundError"),
    (lambda d: [unverified(d), (d / "saved_model" / "saved_model.pb").write_bytes(b"")],
     "saved_model: cannot be loaded (ValueError"),
    (lambda d: [unverified(d), shutil.rmtree(d / "saved_model"), (d / "saved_model").mkdir()],
     "saved_model: cannot be loaded"),
    (lambda d: edit_byte(d / "saved_model" / "variables" / "variables.data-00000-of-00001"),
     "variables.data-00000-of-00001: its sha256 is not the one export wrote (export.json files): saved_model " + CHANGED),
    (lambda d: edit_byte(d / "saved_model" / "saved_model.pb", at=1000), "saved_model/saved_model.pb: its sha256 is not"),
    (lambda d: (d / "saved_model" / "assets" / "x.txt").write_text("x"),
     "saved_model/assets/x.txt: a file export did not write (export.json files)"),
    (lambda d: edit_json(d / "export.json", files=None), "export.json: files null is not {path: {bytes, sha256}}"),
    (lambda d: edit_json(d / "export.json", format=2), "export.json: format 2, newer than this code reads (1); speak it "
     "with the code that exported it, or export it again with this code (snakemake --cores all export; a folder "
     "written with --out: python -m pipeline.export --config CONFIG --out DIR)"),
    (lambda d: edit_json(d / "export.json", format="1"), "export.json: format '1' is not an integer in 1..1"),
    (lambda d: edit_json(d / "export.json", format=2, sample_rate=None), "export.json: format 2, newer than this"),
    (lambda d: edit_json(d / "export.json", sample_rate=0), "export.json: sample_rate 0 is not an integer in 1000.."),
    (lambda d: edit_json(d / "export.json", sample_rate=-22050), "export.json: sample_rate -22050 is not an integer"),
    (lambda d: edit_json(d / "export.json", max_seconds=1e308), "export.json: max_seconds 1e+308 is not a number in"),
    (lambda d: edit_json(d / "export.json", max_frames="862"), "export.json: max_frames '862' is not an integer"),
    (lambda d: edit_json(d / "export.json", audio=None), "export.json / vocab.json are not what an export writes"),
    # were a ValueError / OverflowError traceback (NaN, an integer no float holds), or loaded silently
    (lambda d: edit_json(d / "export.json", sample_rate=float("nan")), "export.json: sample_rate nan is not an integer"),
    (lambda d: edit_json(d / "export.json", sample_rate=10**400), "export.json: sample_rate a 401-character value is"),
    (lambda d: edit_json(d / "export.json", sample_rate=8000), "export.json: sample_rate 8000 is not audio.sample_rate"),
    (lambda d: edit_json(d / "export.json", speakers="abc"), 'export.json: speakers "abc" is not a list of distinct'),
    (lambda d: edit_json(d / "export.json", languages=[1]), "export.json: languages [1] is not a list of distinct"),
])
def test_a_damaged_voice_folder_is_one_error_naming_it(exported_voice, tmp_path, damage, message):
    # were tracebacks from tf.saved_model.load, or a voice of sample rate 0 / max_seconds 1e308
    folder = copy_of(exported_voice, tmp_path)
    damage(folder)
    with pytest.raises(VoiceError) as e:
        load(folder)
    assert message in str(e.value) and str(folder) in str(e.value) and "\n" not in str(e.value)


def test_a_file_browsers_hidden_litter_in_saved_model_is_not_taken_for_a_swap(exported_voice, tmp_path):
    # a .DS_Store (Finder) or ._x (AppleDouble) beside the files export wrote: the voice refused to load
    folder = copy_of(exported_voice, tmp_path)
    for litter in (folder / "saved_model" / ".DS_Store", folder / "saved_model" / "variables" / "._variables.index"):
        litter.write_bytes(b"\0\0\0\1Bud1")
    voice = load(folder)
    assert voice.verified and len(voice.audio(voice.prepare("Hello."))) > 0
    (folder / "saved_model" / "variables" / "variables.index").rename(folder / "saved_model" / "variables" / ".x")
    with pytest.raises(VoiceError, match="variables.index: missing"):   # a listed file hidden away is still missing
        load(folder)


def test_a_saved_model_copied_in_from_another_export_is_refused_before_tensorflow_loads(exported_voice, tmp_path):
    # loaded and spoke with this folder's vocabulary and sample rate, without a word
    folder, other = copy_of(exported_voice, tmp_path), tone_voice(tmp_path / "other")
    shutil.rmtree(folder / "saved_model")
    shutil.copytree(other / "saved_model", folder / "saved_model")
    with pytest.raises(VoiceError) as e:
        load(folder)
    assert str(e.value).startswith(f"{folder / 'saved_model'}/") and str(e.value).endswith("saved_model " + CHANGED)
    proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(folder), "--out", str(tmp_path / "a.wav"),
                                          "Hello.", blocked=BEFORE_THE_MODEL), capture_output=True, text=True,
                          env=child_env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1] == f"error: {e.value}", proc.stderr[-3000:]


def test_an_export_from_before_format_loads_unverified_with_one_note(exported_voice, tmp_path):
    folder = copy_of(exported_voice, tmp_path)
    unverified(folder)
    said = []
    voice = load(folder, log=said.append)
    assert not voice.verified and len(voice.audio(voice.prepare("Hello."))) > 0
    assert [s for s in said if "unverified" in s] == [
        f"note: {folder / 'export.json'}: no format, an export from before its files' digests: saved_model/ loads "
        "unverified; export the voice again (snakemake --cores all export; a folder written with --out: "
        "python -m pipeline.export --config CONFIG --out DIR) to have it checked"]
    assert load(copy_of(exported_voice, tmp_path, "current"), log=said.append).verified and len(said) == 1


def test_a_voice_exported_at_the_longest_max_seconds_loads(exported_voice, tmp_path):
    # synthesize.max_seconds 3600 (the schema's bound) exported max_frames = ceil(3600 * rate / hop), one
    # more than the loader's 3600 * rate / hop: "max_frames 310079 is not an integer in 1..310078"
    import math
    folder = copy_of(exported_voice, tmp_path)
    meta = json.loads((folder / "export.json").read_text())
    frames = math.ceil(3600 * meta["sample_rate"] / meta["audio"]["hop_length"])
    edit_json(folder / "export.json", max_seconds=3600.0, max_frames=frames)
    assert load(folder).max_samples == frames * meta["audio"]["hop_length"]


@pytest.mark.parametrize("change", [1, -1])
def test_a_vocabulary_of_another_size_than_the_models_is_refused_at_load(exported_voice, tmp_path, change):
    # a vocab.json one symbol longer loaded, and `[[ Q ]]` then failed inside the graph (a 500)
    folder = copy_of(exported_voice, tmp_path)
    vocab = json.loads((folder / "vocab.json").read_text())
    n = len(vocab["symbols"])
    vocab["symbols"] = vocab["symbols"] + ["Q"] if change > 0 else vocab["symbols"][:-1]
    (folder / "vocab.json").write_text(json.dumps(vocab))
    with pytest.raises(VoiceError, match=rf"vocab.json: {n + change} symbols, but the model takes {n}; export"):
        load(folder)


def test_speak_says_a_damaged_folder_in_one_line(exported_voice, tmp_path):
    folder = copy_of(exported_voice, tmp_path)
    unverified(folder)   # a current export's is refused before the load (test_a_damaged_voice_folder_...)
    (folder / "saved_model" / "saved_model.pb").write_bytes(b"")
    proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(folder), "--out", str(tmp_path / "a.wav"),
                                          "Hello."), capture_output=True, text=True, env=child_env(), cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: {folder / 'saved_model'}: cannot be loaded")


def tone_voice(folder):
    """A voice whose graph says 400 / pace samples per token (EOS too) and stops at max_frames as an
    export does (16 kHz, hop 4, max_seconds 0.2: 3200 samples): character front end."""
    import tensorflow as tf

    from pipeline import text
    from pipeline.export import SIGNATURE

    spec = (tf.TensorSpec([1, None], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32))

    class Tone(tf.Module):
        @tf.function(input_signature=spec)
        def synthesize(self, tokens, pace, pitch_shift):
            n = tf.cast(tf.cast(tf.shape(tokens)[1], tf.float32) * 400.0 / pace, tf.int32)
            n = tf.minimum(n, 3200)
            return {"audio": (0.1 * tf.sin(tf.range(n, dtype=tf.float32) * 0.1))[tf.newaxis]}

    tf.saved_model.save(Tone(), str(folder / "saved_model"), signatures={SIGNATURE: Tone().synthesize})
    vocab = text.vocabulary({"frontend": "characters", "language": "en-us", "cleaners": "english"})
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "export.json").write_text(json.dumps({"sample_rate": 16000, "audio": {"hop_length": 4},
                                                    "max_seconds": 0.2, "max_frames": 800, "speakers": [],
                                                    "languages": []}))
    return folder


@pytest.fixture(scope="module")
def tone(tmp_path_factory):
    voice = load(tone_voice(tmp_path_factory.mktemp("tone")))
    calls = []
    said = voice._call

    def call(symbols, *args):
        audio = said(symbols, *args)
        calls.append(len(audio))
        return audio
    voice._call, voice.calls = call, calls
    return voice


def test_a_word_whose_audio_reaches_max_frames_is_split_between_symbols_not_cut(tone):
    # "xxxx" at pace 0.5 reached max_frames (3200 samples) and, having no space to halve at, was kept
    # cut: 6400 samples for two such pieces. Now each is said again as "xx" + "xx": 4 x 2400.
    tone.calls.clear()
    pcm = tone.audio(tone.prepare("xxxxxxxx", pace=0.5))
    assert max(tone.calls) == 3200 and [c for c in tone.calls if c < 3200] == [2400] * 4
    assert len(pcm) == 4 * 2400


def test_a_symbol_that_alone_reaches_max_frames_is_an_error(tone):
    with pytest.raises(VoiceError, match=r"^'x': one symbol makes 0.2 s of audio or more .* at pace 0.25; ask for"):
        tone.audio(tone.prepare("x", pace=0.25))


def test_a_sentence_is_refused_before_its_audio_is_made(tone):
    from pipeline.voice import TooLong
    bomb = "hi " + '<break time="10s"/>' * 1000                         # 10,000 s of silence in 21 kB
    for lazy in (False, True):                                          # the same for speak --raw and streams
        with pytest.raises(TooLong, match=r"^sentence 1: over the 600 s of audio one sentence may make \(about "
                                          r"10000 s\); end sentences sooner"):
            tone.prepare(bomb, ssml=True, lazy=lazy)
    with pytest.raises(TooLong, match=r"^over the 1 s of audio one request may make \(about"):
        tone.prepare("Hello there. " * 10, max_seconds=1.0)
    assert len(tone.audio(tone.prepare("Hello there. " * 10, max_seconds=60.0))) > 16000


def test_a_requests_pauses_are_bounded_in_all_before_any_audio(tone):
    # each sentence under its own bound, but 3,840 of them: 100 kB of SSML streamed 10.7 h of silence
    from pipeline.voice import TooLong
    many = "<speak>Hi." + "<s><break time='10s'/></s>" * 100 + "</speak>"      # 1,000 s in 101 sentences
    for lazy in (False, True):
        with pytest.raises(TooLong, match=r"^1000 s of pauses \(<break>\) in all, over the 600 s one request may "
                                          r"hold$"):
            tone.prepare(many, ssml=True, lazy=lazy, max_pause_seconds=600)
    assert tone.prepare(many, ssml=True, lazy=True).ready == 1           # speak's own: no bound asked for
    fine = "<speak>Hi." + "<s><break time='10s'/></s>" * 60 + "</speak>"       # 600 s: at the bound, taken
    assert tone.prepare(fine, ssml=True, lazy=True, max_pause_seconds=600).ready == 1
    # the 0.5 s before each paragraph grows with the text, as its speech does: not a <break>
    verse = "\n\n".join(f"Line {i}." for i in range(1300))                    # 650 s of them in 14 kB
    assert tone.prepare(verse, lazy=True, max_pause_seconds=600).ready == 1


def test_a_sentence_whose_audio_outgrows_the_estimate_stops_at_the_bound(tone, monkeypatch):
    # the estimate is low on purpose; what the graph really makes is counted piece by piece, and a
    # sentence stops at its bound (here 0.5 s) with no more than one call's audio beyond it
    from pipeline.voice import TooLong
    monkeypatch.setattr(tone, "max_sentence_samples", 8000)
    monkeypatch.setattr(tone, "_sps", tone._sps / 100)   # estimates 100 x too short
    request = tone.prepare("xx " * 100 + ". Fine.", lazy=True)
    tone.calls.clear()
    with pytest.raises(TooLong, match="^over the 0.5 s of audio one sentence may make"):
        list(tone.sentences_audio(request))
    assert sum(c for c in tone.calls if c < 3200) <= 8000 + 3200          # kept: not cut at max_frames


def test_a_sentence_with_a_number_too_long_to_read_is_refused_not_skipped(tone):
    # the sentence gave no symbols and was skipped as if it were punctuation: "Hello there. Goodbye."
    account = "Hello there. My account number is " + "1" * 101 + ". Goodbye."
    for lazy in (False, True):
        with pytest.raises(VoiceError, match=r"^'My account number is 1+': a number of 101 digits \(more than 100"):
            list(tone.sentences_audio(tone.prepare(account, lazy=lazy)))
    assert len(tone.audio(tone.prepare("Hello there. ... Goodbye."))) > 0      # punctuation alone: nothing to say


def test_a_stream_refuses_up_front_what_the_whole_answer_refuses(tone):
    # lazily (a stream, speak --raw) "..." counted as something to say: 200 with no audio, or silence
    for lazy in (False, True):
        for text in ("... . . .", '<speak>... <break time="2s"/></speak>'):
            with pytest.raises(VoiceError, match=r"^'.*': nothing to say$"):
                tone.prepare(text, lazy=lazy)
        with pytest.raises(VoiceError, match=r"^'你好.': '你' .* not in the script of text.language en-us"):
            tone.prepare("... 你好. Hello.", lazy=lazy)          # the first sentence that says something: up front
    said = []
    with pytest.raises(VoiceError, match="你"):                           # a later one: in its turn, as documented
        said += tone.sentences_audio(tone.prepare("Hello. 你好.", lazy=True))
    assert len(said) == 1 and len(said[0]) > 0


def test_a_sentence_too_long_to_read_is_refused_before_the_front_end(tone, monkeypatch):
    # one 98 kB sentence took ~30 s of the front end's CPU before its 413
    from pipeline.voice import TooLong
    monkeypatch.setattr(tone, "_front_end", lambda *a: pytest.fail("the front end ran"))
    for lazy in (False, True):
        with pytest.raises(TooLong, match=r"^sentence 2: 98000 characters, over the 20000 one sentence may hold; end "
                                          r"sentences sooner \(\. ! \?\)$"):
            tone.prepare("Hi. " + "A." * 49000, lazy=lazy)     # capital: "Hi. a." goes on (pipeline/markup.py)


def test_a_sentence_of_exactly_the_most_characters_reaches_the_front_end(tone, monkeypatch):
    from pipeline.voice import MAX_SENTENCE_CHARACTERS

    class Reached(Exception):
        pass

    def front_end(*args):
        raise Reached
    monkeypatch.setattr(tone, "_front_end", front_end)
    with pytest.raises(Reached):
        tone.prepare("a" * MAX_SENTENCE_CHARACTERS)


def test_no_call_is_given_more_tokens_than_export_json_max_tokens(tone, monkeypatch):
    # the graph refuses more than max_tokens ids, EOS included: a piece of max_tokens symbols was a 500
    monkeypatch.setattr(tone, "max_tokens", 6)
    tone.calls.clear()
    tone.audio(tone.prepare("xxxxxxxxxxxx", pace=4.0))
    assert tone.calls and max(tone.calls) <= 6 * 100          # 100 samples a token at pace 4


def test_a_request_stops_at_its_own_bound_when_it_is_longer_than_a_sentences(tone, monkeypatch):
    # serve's requests are bounded at 600 s, as a sentence is: the request's bound must still hold
    from pipeline.voice import TooLong
    monkeypatch.setattr(tone, "max_sentence_samples", 8000)      # 0.5 s a sentence
    monkeypatch.setattr(tone, "_sps", tone._sps / 100)          # estimates 100 x too short: prepare lets it by
    request = tone.prepare("Hello there. " * 10, max_seconds=1.0)
    with pytest.raises(TooLong, match=r"^over the 1 s of audio one request may make") as e:
        list(tone.sentences_audio(request))
    assert e.value.whole


def test_nested_prosody_pitch_beyond_the_graphs_range_is_refused_before_any_audio(tone):
    # the graph takes -24..24 semitones: nested <prosody> adds up past it, a 500 from the graph
    deep = ('<speak><prosody pitch="+12st"><prosody pitch="+12st"><prosody pitch="+1st">up</prosody>'
            '</prosody></prosody></speak>')
    with pytest.raises(VoiceError, match=r"pitch shift 0 \+ prosody pitch 25: 25\.0 is outside -24\.\.24$"):
        tone.prepare(deep)


def test_speak_and_serve_say_what_a_folders_files_show_before_tensorflow_loads(exported_voice, tmp_path):
    # each took ~7 s, TensorFlow's start-up, to say it: TensorFlow is unimportable in these processes
    from test_serve import free_port
    folder = copy_of(exported_voice, tmp_path)
    rate = json.loads((folder / "export.json").read_text())["sample_rate"]
    edit_json(folder / "export.json", sample_rate=0)
    for module, args in (("pipeline.speak", ("--out", str(tmp_path / "a.wav"), "Hello.")),
                         ("pipeline.serve", ("--port", str(free_port())))):
        proc = subprocess.run(blocked_command(module, "--voice", str(folder), *args, blocked=BEFORE_THE_MODEL),
                              capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=300)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
            f"error: {folder / 'export.json'}: sample_rate 0 is not an integer in 1000..192000; export the voice "
            "again"], (module, proc.stderr[-3000:])
    # the folder mended, the voice loads: what needs TensorFlow, which the block above kept out
    edit_json(folder / "export.json", sample_rate=rate)
    proc = subprocess.run(blocked_command("pipeline.speak", "--voice", str(folder), "--out", str(tmp_path / "a.wav"),
                                          "Hello.", blocked=BEFORE_THE_MODEL),
                          capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=300)
    assert proc.returncode != 0 and "tensorflow" in proc.stderr and not (tmp_path / "a.wav").exists(), proc.stderr[-3000:]
