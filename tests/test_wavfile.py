"""pipeline/wavfile.py, the one wav writer: 16-bit PCM that soundfile reads back, clipping scaled away
(or limited: the voice's sentences), NaN refused, atomic and durable writes, a full disk one line, and the output path checked before work."""
import errno
import os
import re

import numpy as np
import pytest
import soundfile as sf

from pipeline import errors, wavfile
from pipeline.errors import PipelineError


def test_save_wav_writes_16_bit_and_normalises_clipping(tmp_path):
    path = tmp_path / "sub" / "out.wav"
    audio = 2.0 * np.sin(np.linspace(0, 200 * np.pi, 4000)).astype(np.float32)  # peak 2: would clip
    wavfile.save_wav(str(path), audio, 22050)
    info = sf.info(str(path))
    assert (info.samplerate, info.channels, info.frames, info.subtype) == (22050, 1, 4000, "PCM_16")
    back, _ = sf.read(str(path), dtype="float32")
    assert 0.9 < np.abs(back).max() <= 0.951
    assert os.listdir(path.parent) == ["out.wav"]                              # no temp file left behind

    quiet = 0.5 * audio / 2.0
    wavfile.save_wav(str(path), quiet, 16000)                                  # overwrite; not rescaled
    back, sr = sf.read(str(path), dtype="float32")
    assert sr == 16000 and np.allclose(back, quiet, atol=1e-4)


def test_save_wav_converts_block_by_block_to_the_samples_soundfile_writes(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    audio = np.clip(rng.normal(0, 0.3, 10_000), -1, 1).astype(np.float32)
    monkeypatch.setattr(wavfile, "BLOCK", 999)                                 # many blocks, one short last one
    wavfile.save_wav(tmp_path / "ours.wav", audio, 22050)
    sf.write(tmp_path / "theirs.wav", audio, 22050, subtype="PCM_16")
    ours, _ = sf.read(tmp_path / "ours.wav", dtype="int16")
    theirs, _ = sf.read(tmp_path / "theirs.wav", dtype="int16")
    assert len(ours) == len(audio) and np.array_equal(ours, theirs)            # the bytes save_wav wrote before
    pcm = np.clip(np.floor(audio * 32768), -32768, 32767).astype(np.int16)
    wavfile.write_pcm(tmp_path / "pcm.wav", pcm, 22050)                        # the int16 writer, same bytes
    assert (tmp_path / "pcm.wav").read_bytes() == (tmp_path / "ours.wav").read_bytes() == wavfile.wav_bytes(pcm, 22050)


def test_to_pcm_gives_the_samples_save_wav_writes(tmp_path, monkeypatch):
    # speak and serve turn float audio into int16 here: their own conversion clipped what save_wav scales
    monkeypatch.setattr(wavfile, "BLOCK", 999)                                 # the peak of the whole, not a block's
    loud = 2.0 * np.sin(np.linspace(0, 200 * np.pi, 4000)).astype(np.float32)
    for audio in (loud, loud / 4, np.zeros(0, np.float32)):
        wavfile.save_wav(tmp_path / "a.wav", audio, 22050)
        pcm = wavfile.to_pcm(audio)
        assert pcm.dtype == np.int16 and wavfile.wav_bytes(pcm, 22050) == (tmp_path / "a.wav").read_bytes()
    assert np.abs(wavfile.to_pcm(loud).astype(int)).max() == pytest.approx(0.95 * 32768, abs=1)   # not clipped
    np.testing.assert_array_equal(wavfile.to_pcm(loud / 4), np.floor(loud / 4 * 32768))   # kept as it is
    with pytest.raises(PipelineError, match=r"^--raw: the audio has NaN or infinite samples"):
        wavfile.to_pcm(np.array([0.1, np.nan]), "--raw")
    # an utterance as its chunks (speak --out): the same samples, no float copy of the whole
    chunks = [loud[:1500], loud[1500:1501], loud[1501:]]
    np.testing.assert_array_equal(wavfile.to_pcm(chunks), wavfile.to_pcm(loud))
    with pytest.raises(PipelineError, match=r"^--out a\.wav: the audio has NaN"):   # in any chunk, not only the first
        wavfile.to_pcm([loud, np.array([np.nan, 3.0], np.float32)], "--out a.wav")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_audio_with_a_non_finite_sample_is_refused_and_nothing_is_written(tmp_path, bad):
    audio = np.zeros(100, np.float32)
    audio[37] = bad
    with pytest.raises(PipelineError, match=r"out.wav: the audio has NaN or infinite samples; nothing written"):
        wavfile.save_wav(tmp_path / "out.wav", audio, 22050)
    assert os.listdir(tmp_path) == []


def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", no_space)

    @errors.cli
    def main(argv=None):
        wavfile.save_wav(tmp_path / "out.wav", np.zeros(100), 22050)

    with pytest.raises(SystemExit) as exit_:
        main([])
    assert exit_.value.code == errors.EXIT_EXPECTED
    assert capsys.readouterr().err == f"error: no space left on device writing {tmp_path / 'out.wav'}; free space and rerun\n"
    assert os.listdir(tmp_path) == []
    with pytest.raises(errors.DiskFull):
        wavfile.write_pcm(tmp_path / "pcm.wav", np.zeros(10, np.int16), 22050)
    assert os.listdir(tmp_path) == []


def test_check_path_names_the_flag_before_any_work(tmp_path):
    wavfile.check_path(tmp_path / "a/b/c.wav", "--out")                        # missing folders are made later
    with pytest.raises(PipelineError, match=f"^--wav {tmp_path}: a folder; give the path of the .wav to write$"):
        wavfile.check_path(tmp_path, "--wav")
    (tmp_path / "f").write_text("")
    with pytest.raises(PipelineError, match=f"^--out {tmp_path / 'f/x.wav'}: {tmp_path / 'f'} is a file, not a folder$"):
        wavfile.check_path(tmp_path / "f/x.wav")
    for folder in (f"{tmp_path}/new/", f"{tmp_path}/new/.."):   # Path() drops the "/": a file "new" was written
        with pytest.raises(PipelineError, match="a folder \\(a path ending in /, . or ..\\); give the path of the .wav"):
            wavfile.check_path(folder, "--out")
    # `speak --out hello.mp3` wrote a wav named .mp3, exit 0: a player that trusts the name fails on it
    for name, kind in (("hello.mp3", "MP3"), ("Hello.FLAC", "FLAC"), ("x.ogg", "Ogg")):
        with pytest.raises(PipelineError, match=f"^--out {re.escape(str(tmp_path / name))}: this writes a 16-bit wav, "
                                                f"not {kind}; name it .wav"):
            wavfile.check_path(tmp_path / name, "--out")
    os.symlink("target.mp3", tmp_path / "link.wav")         # a link written through to a .mp3
    with pytest.raises(PipelineError, match=re.escape(f"not MP3 (into {tmp_path / 'target.mp3'}); name it .wav")):
        wavfile.check_path(tmp_path / "link.wav", "--out")
    wavfile.check_path(tmp_path / "hello", "--out")          # no extension: a wav all the same
    wavfile.check_path(tmp_path / "take.2.WAV", "--out")


def test_a_link_is_written_through_and_a_device_or_pipe_is_never_replaced(tmp_path):
    # a rename onto --out replaced whatever was there: a symbolic link became a file (its target
    # untouched), a FIFO a file (its reader hung), and as root /dev/null a regular file
    audio = np.zeros(2205, np.float32)
    (tmp_path / "target.wav").write_bytes(b"old")
    os.symlink("target.wav", tmp_path / "link.wav")
    wavfile.check_path(tmp_path / "link.wav")
    wavfile.save_wav(tmp_path / "link.wav", audio, 22050)
    assert os.path.islink(tmp_path / "link.wav") and sf.info(str(tmp_path / "target.wav")).frames == 2205
    os.mkfifo(tmp_path / "fifo.wav")
    os.symlink(os.devnull, tmp_path / "null.wav")
    for path in (tmp_path / "fifo.wav", tmp_path / "null.wav", os.devnull):
        with pytest.raises(PipelineError, match="^--out .*not a regular file"):
            wavfile.check_path(path)
        with pytest.raises(PipelineError, match="not a regular file"):
            wavfile.save_wav(path, audio, 22050)
    assert not os.path.isfile(os.devnull) and os.path.islink(tmp_path / "null.wav")
    assert sorted(os.listdir(tmp_path)) == ["fifo.wav", "link.wav", "null.wav", "target.wav"]  # no temporary file


def test_the_running_minimum_is_every_windows_minimum():
    values = np.random.default_rng(0).random(1000)
    for width in (1, 2, 7, 10, 999, 1000):
        want = [values[i:i + width].min() for i in range(len(values) - width + 1)]
        np.testing.assert_array_equal(wavfile._running_min(values, width), want)


def test_the_limiter_brings_only_the_peaks_over_1_down_to_095():
    sr, h = 22050, round(wavfile.LIMIT_SECONDS * 22050)
    audio = (0.5 * np.sin(2 * np.pi * 150 * np.arange(3 * sr) / sr)).astype(np.float32)
    audio[30000:30100] *= 2.6                                                  # a burst peaking at 1.3
    out = wavfile.limit_peaks(audio, sr)
    assert out.dtype == np.float32 and len(out) == len(audio)
    assert np.abs(out).max() == pytest.approx(wavfile.PEAK, abs=1e-6)         # the peak itself at 0.95, not lower
    changed = np.flatnonzero(out != audio)
    assert changed.min() >= 30000 - 2 * h and changed.max() < 30100 + 2 * h     # within 2 x 10 ms of the burst
    assert np.all(np.abs(out) <= np.abs(audio))                                 # a gain, never above 1
    # loud noise: every sample needs some gain, and none ends above 0.95
    noise = np.random.default_rng(1).normal(0, 0.8, sr).astype(np.float32)
    assert np.abs(noise).max() > 2 and np.abs(wavfile.limit_peaks(noise, sr)).max() <= wavfile.PEAK
    # one huge sample late in a sentence: a float running sum lost its tiny gain (a review found 1.86)
    spiky = np.tile(audio[:sr], 10)
    spiky[-5] = 4e10                                                            # 1.16 before the gain was bounded
    limited = wavfile.limit_peaks(spiky, sr)
    assert np.abs(limited).max() <= wavfile.PEAK and np.array_equal(limited[:-2 * h - 5], spiky[:-2 * h - 5])
    assert wavfile._running_min(np.ones(3), 9).size == 0                       # a window longer than the values
    for kept in (audio / 2.6, np.zeros(0, np.float32), np.array([0.5, np.nan, 2.0], np.float32),
                 np.array([0.5, 1.0, -1.0, 0.25], np.float32)):             # a peak of 1 exactly is no clip
        np.testing.assert_array_equal(wavfile.limit_peaks(kept, sr), kept)    # at most 1, or NaN: to_pcm refuses


def test_a_reader_of_the_old_file_reads_it_whole_while_it_is_replaced(tmp_path):
    # the new file is renamed over the old one, never written into it: a player (or the server) that
    # opened the old wav reads the old wav to its end, not a truncated mix of the two
    from pipeline import files
    path = tmp_path / "out.wav"
    wavfile.save_wav(path, np.full(2205, 0.25, np.float32), 22050)
    old = path.read_bytes()
    with open(path, "rb") as reader:
        wavfile.save_wav(path, np.full(4410, -0.5, np.float32), 22050)
        assert reader.read() == old
    assert sf.info(str(path)).frames == 4410
    with open(path, "rb") as reader:
        files.atomic_write_text(path, "new text")
        assert reader.read(4) == b"RIFF"
    assert path.read_text() == "new text"


def test_an_output_inside_an_input_folder_or_another_name_of_an_input_is_refused(tmp_path):
    # `--out VOICE/sub/x.wav` lies in the folder read, a hard link is the file read under another name
    from pipeline import files
    voice, mel = tmp_path / "voice", tmp_path / "m.npy"
    (voice / "sub").mkdir(parents=True)
    mel.write_bytes(b"mel")
    os.link(mel, tmp_path / "second-name.npy")
    inputs = {"--voice": str(voice), "--mel": str(mel)}
    for out, said in ((voice / "sub" / "x.wav", f"it lies in that folder, --voice {voice}"),
                      (tmp_path / "second-name.npy", f"it is that file, --mel {mel}")):
        with pytest.raises(PipelineError, match=f"^--out {re.escape(str(out))}: {re.escape(said)}, which this command "
                                                "reads; write the output elsewhere$"):
            files.check_not_input(out, "--out", inputs)
    files.check_not_input(tmp_path / "x.wav", "--out", inputs)


def test_a_link_into_a_folder_no_file_can_be_made_in_is_refused_before_any_work(tmp_path):
    # what is written is the link's target: its folder is the one that must take a new file
    os.symlink("/proc/x.wav", tmp_path / "link.wav")
    with pytest.raises(PipelineError, match=f"^--out {re.escape(str(tmp_path / 'link.wav'))}: "
                                            r"(/proc is not writable|cannot write in /proc )"):
        wavfile.check_path(tmp_path / "link.wav", "--out")


def test_stream_pcm_appends_each_block_as_it_comes_and_renames_the_whole_onto_the_path(tmp_path):
    # speak --out held all of a book's audio in memory before its one write (~7 GB for 8 hours): each
    # block is now on disk, in the temporary file beside the path, before the next is made
    from pipeline import files
    path, rng = tmp_path / "book.wav", np.random.default_rng(0)
    path.write_bytes(b"RIFF an older take")
    blocks = [rng.integers(-32768, 32767, n).astype(np.int16) for n in (5000, 1, 0, 4567)]   # over io's 8 KiB buffer
    tmp, seen = files.temporary(path), []

    def made():
        for block in blocks:
            seen.append((tmp.stat().st_size, path.read_bytes()))
            yield block
    assert wavfile.stream_pcm(path, made(), 22050) == 9568
    assert path.read_bytes() == wavfile.wav_bytes(np.concatenate(blocks), 22050)   # write_pcm's bytes
    sizes = [size for size, _ in seen]
    assert sizes == [0, 44 + 10000, 44 + 10002, 44 + 10002] and {old for _, old in seen} == {b"RIFF an older take"}
    assert os.listdir(tmp_path) == ["book.wav"]
    assert sf.info(str(path)).frames == 9568


def test_stream_pcm_leaves_the_path_as_it_was_when_the_blocks_fail_or_pass_what_a_wav_holds(tmp_path, monkeypatch):
    path = tmp_path / "book.wav"
    path.write_bytes(b"RIFF an older take")

    def failing():
        yield np.zeros(100, np.int16)
        raise PipelineError("line 7: a sentence it cannot say")
    with pytest.raises(PipelineError, match="^line 7: "):
        wavfile.stream_pcm(path, failing(), 22050)
    # a wav's sizes are 32-bit: past 4 GiB the wave module failed with a struct.error traceback
    assert wavfile.MAX_DATA + 36 == 0xFFFFFFFF                       # the RIFF size of the largest wav
    monkeypatch.setattr(wavfile, "MAX_DATA", 300)
    with pytest.raises(PipelineError) as refused:
        wavfile.stream_pcm(path, iter([np.zeros(100, np.int16), np.zeros(50, np.int16), np.zeros(1, np.int16)]),
                           22050, "--out book.wav")
    assert str(refused.value) == ("--out book.wav: the audio passes 4 GiB, the most a wav holds (about 0.0 hours at "
                                  "22050 Hz); nothing written; say the text in parts")
    assert wavfile.stream_pcm(path, iter([np.zeros(150, np.int16)]), 22050) == 150   # up to the limit: written
    assert sf.info(str(path)).frames == 150 and os.listdir(tmp_path) == ["book.wav"]
    with pytest.raises(PipelineError, match=f"^{re.escape(str(path))}: the audio passes 4 GiB"):
        wavfile.stream_pcm(path, iter([np.zeros(151, np.int16)]), 22050)
    assert sf.info(str(path)).frames == 150 and os.listdir(tmp_path) == ["book.wav"]


def test_check_path_refuses_a_symbolic_link_loop_on_the_way(tmp_path):
    # `ln -s loop loop; --out loop/x.wav` passed the check and the write failed with a traceback
    # (FileExistsError making the folder); a link to itself passed too, and was replaced by a file
    os.symlink("loop", tmp_path / "loop")
    os.symlink("self.wav", tmp_path / "self.wav")
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    for given, link in (("loop/x.wav", "loop"), ("loop/new/sub/x.wav", "loop"), ("a/x.wav", "a"), ("self.wav", None),
                        ("b", None)):
        path = tmp_path / given
        said = "it is" if link is None else f"{tmp_path / link} is"
        with pytest.raises(PipelineError, match=f"^--out {re.escape(str(path))}: {re.escape(said)} a symbolic link "
                                                "that leads back to itself; give the path of the .wav to write$"):
            wavfile.check_path(path, "--out")
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "loop", "self.wav"] and os.path.islink(tmp_path / "self.wav")
