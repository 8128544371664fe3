"""Which aligner a new aligner folder holds: a sibling's weights when the training key is the same
(a `pitch:` or duration-code change, or a folder made before the key had two parts), else training."""
import json

from pipeline import aligner_folder, shards


def _aligner(folder, weights=b"w" * 64, arrays=b"a" * 32, **info):
    folder.mkdir(parents=True)
    (folder / "aligner.weights.h5").write_bytes(weights)
    (folder / "aligner.npz").write_bytes(arrays)
    info = {"weights": "aligner.weights.h5", "arrays": "aligner.npz", "weights_digest": shards.file_digest(
        folder / "aligner.weights.h5"), "arrays_digest": shards.file_digest(folder / "aligner.npz"), **info}
    (folder / "aligner.json").write_text(json.dumps(info))
    return info


def test_a_sibling_under_the_same_training_key_is_copied_by_record_or_by_its_folders_name(tmp_path):
    root, logged = tmp_path / "runs" / "demo" / "aligner", []
    _aligner(root / "aaaaaaaaaaaa", weights=b"old" * 20)             # made before: named by its training key
    _aligner(root / "bbbbbbbbbbbb", weights=b"other" * 20, train_key="cccccccccccc")
    out = root / "dddddddddddd" / "aligner.json"
    out.parent.mkdir()
    copied = aligner_folder.copy_by_key(out, "aaaaaaaaaaaa", logged.append)
    assert copied["copied_from"] == "aaaaaaaaaaaa" and copied["train_key"] == "aaaaaaaaaaaa"
    assert (out.parent / "aligner.weights.h5").read_bytes() == b"old" * 20 and "copied its weights" in logged[0]
    assert json.loads(out.read_text())["train_key"] == "aaaaaaaaaaaa"
    # a later folder finds that one by the key it recorded (and by the first one's name: the same weights)
    later = root / "eeeeeeeeeeee" / "aligner.json"
    later.parent.mkdir()
    assert aligner_folder.copy_by_key(later, "cccccccccccc", logged.append)["copied_from"] == "bbbbbbbbbbbb"
    # no sibling of that training key: it trains
    fresh = root / "ffffffffffff" / "aligner.json"
    fresh.parent.mkdir()
    assert aligner_folder.copy_by_key(fresh, "999999999999", logged.append) is None
    # a folder made before and run again (--forcerun train_aligner): it trains, though a sibling matches
    assert aligner_folder.copy_by_key(out, "aaaaaaaaaaaa", logged.append) is None


def test_a_sibling_whose_weights_do_not_match_their_record_is_not_copied(tmp_path):
    root = tmp_path / "aligner"
    _aligner(root / "aaaaaaaaaaaa")
    (root / "aaaaaaaaaaaa" / "aligner.npz").write_bytes(b"damaged")
    out = root / "dddddddddddd" / "aligner.json"
    out.parent.mkdir()
    assert aligner_folder.copy_by_key(out, "aaaaaaaaaaaa", print) is None
    assert not (out.parent / "aligner.weights.h5").exists()


def test_of_siblings_under_one_training_key_the_newest_is_copied(tmp_path):
    # the old folder (named by the key) sorted first: an aligner retrained since with --forcerun was
    # silently replaced by the weights it had been forced over
    import os
    root = tmp_path / "aligner"
    _aligner(root / "aaaaaaaaaaaa", weights=b"old" * 20)
    _aligner(root / "cccccccccccc", weights=b"retrained" * 20, train_key="aaaaaaaaaaaa")
    os.utime(root / "aaaaaaaaaaaa" / "aligner.json", ns=(1, 1))
    (root / "bbbbbbbbbbbb").mkdir()
    (root / "bbbbbbbbbbbb" / "aligner.json").write_text("null")  # valid JSON, no record: not a source
    out = root / "dddddddddddd" / "aligner.json"
    out.parent.mkdir()
    assert aligner_folder.copy_by_key(out, "aaaaaaaaaaaa", print)["copied_from"] == "cccccccccccc"
    assert (out.parent / "aligner.weights.h5").read_bytes() == b"retrained" * 20


def test_a_run_that_forces_train_aligner_trains_a_new_folder(tmp_path, monkeypatch):
    from pipeline import align
    root = tmp_path / "aligner"
    _aligner(root / "aaaaaaaaaaaa")
    out = root / "dddddddddddd" / "aligner.json"
    out.parent.mkdir()
    trained = []

    def train(cfg, path, log):  # what align.train_aligner reads first: the marker of a folder made before
        trained.append((path.with_name(aligner_folder.MADE)).exists())
        path.write_text(json.dumps({"weights": "aligner.weights.h5"}))
    monkeypatch.setattr(align, "train_aligner", train)
    monkeypatch.setenv(aligner_folder.FORCED_ENV, "cache_index,train_aligner")
    info = aligner_folder.fill({}, out, "aaaaaaaaaaaa", log=print)
    assert trained == [True] and "copied_from" not in info and info["train_key"] == "aaaaaaaaaaaa"
    monkeypatch.setenv(aligner_folder.FORCED_ENV, "")
    assert not aligner_folder.forced()
    monkeypatch.setenv(aligner_folder.FORCED_ENV, "*")  # --forceall
    assert aligner_folder.forced()


def test_a_sibling_whose_record_names_no_weights_is_not_a_source(tmp_path):
    # a half-written or hand-edited aligner.json (a dict, its training key, no file names) is skipped, not a KeyError
    root = tmp_path / "aligner"
    (root / "aaaaaaaaaaaa").mkdir(parents=True)
    (root / "aaaaaaaaaaaa" / "aligner.json").write_text(json.dumps({"train_key": "aaaaaaaaaaaa"}))
    out = root / "dddddddddddd" / "aligner.json"
    out.parent.mkdir()
    assert aligner_folder.copy_by_key(out, "aaaaaaaaaaaa", print) is None
    assert not out.exists()


def test_a_folder_is_never_its_own_source(tmp_path):
    # a folder that already holds a record of its own (newer than any sibling's, no `.made`: made by an
    # older pipeline, or its marker removed) must copy the sibling trained under its key, not "copy"
    # itself and record itself in copied_from; alone, it trains
    import os
    root = tmp_path / "aligner"
    _aligner(root / "aaaaaaaaaaaa", weights=b"sibling" * 20)
    os.utime(root / "aaaaaaaaaaaa" / "aligner.json", ns=(1, 1))
    _aligner(root / "dddddddddddd", weights=b"own" * 20, train_key="aaaaaaaaaaaa")
    out = root / "dddddddddddd" / "aligner.json"
    copied = aligner_folder.copy_by_key(out, "aaaaaaaaaaaa", print)
    assert copied["copied_from"] == "aaaaaaaaaaaa" and json.loads(out.read_text())["copied_from"] == "aaaaaaaaaaaa"
    assert (out.parent / "aligner.weights.h5").read_bytes() == b"sibling" * 20
    alone = tmp_path / "other" / "eeeeeeeeeeee"
    _aligner(alone, train_key="eeeeeeeeeeee")
    assert aligner_folder.copy_by_key(alone / "aligner.json", "eeeeeeeeeeee", print) is None
    assert "copied_from" not in json.loads((alone / "aligner.json").read_text())


def test_align_copies_only_a_sound_sibling_trained_from_the_same_caches(tmp_path):
    """pipeline.align's own copy (a new aligner key whose caches' content is unchanged): the sibling whose
    aligner.json records the same `trained_from` and whose files match their digests, never the folder
    itself; the copy records where it came from and marks the folder made, so running it again trains."""
    from pipeline import align
    root, logged = tmp_path / "runs" / "demo" / "aligner", []
    _aligner(root / "aaaaaaaaaaaa", weights=b"same caches" * 9, arrays=b"its arrays" * 5, trained_from="X")
    _aligner(root / "bbbbbbbbbbbb", weights=b"other caches" * 9, trained_from="Y")
    _aligner(root / "cccccccccccc", weights=b"damaged" * 9, trained_from="Z")
    (root / "cccccccccccc" / "aligner.weights.h5").write_bytes(b"damaged" * 8)
    _aligner(root / "eeeeeeeeeeee", weights=b"own" * 9, trained_from="W")   # alone under W: its own record
    out = root / "dddddddddddd" / "aligner.json"
    out.parent.mkdir()
    copied = align.copy_trained(out, "X", logged.append)
    assert copied["copied_from"] == "aaaaaaaaaaaa" and json.loads(out.read_text()) == copied
    assert copied["trained_from"] == "X" and "copied its weights" in logged[-1]
    assert (out.parent / "aligner.weights.h5").read_bytes() == b"same caches" * 9
    assert (out.parent / "aligner.npz").read_bytes() == b"its arrays" * 5
    # the same folder's job run again (--forcerun train_aligner): it trains, though the sibling matches
    assert align.copy_trained(out, "X", logged.append) is None and "training anew" in logged[-1]
    for key, folder in (("Z", "ffffffffffff"), ("W", "eeeeeeeeeeee"), ("V", "gggggggggggg")):
        other = root / folder / "aligner.json"
        other.parent.mkdir(exist_ok=True)
        before = other.read_bytes() if other.exists() else None
        assert align.copy_trained(other, key, logged.append) is None, key
        assert (other.read_bytes() if other.exists() else None) == before, key
    assert not (root / "ffffffffffff" / "aligner.weights.h5").exists()
