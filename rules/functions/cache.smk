# Input and params functions of the caches (rules/cache.smk): each shard job's settings, its rows' and audio files' digests,
# the clip lists the shard jobs read, and the repair of a damaged shard.


def _shard_sources(shard, keys):
    """The sources holding clips of this shard, with just `keys`: adding a source, or changing one
    source's language, changes only the settings of the shards holding its clips."""
    names = sorted({c.source for c in MANIFEST[int(shard)]})
    return [{k: SOURCES[n][k] for k in keys if k in SOURCES[n]} for n in names]


def token_settings(wildcards):
    if SOURCES:
        dataset = {
            "sources": _shard_sources(
                wildcards.shard, ("root", "format", "name", "speaker", "language")
            )
        }
    else:
        dataset = {k: DS[k] for k in ("root", "metadata", "audio_dir")}
    return _inline(
        dataset=dataset,
        cache={"shards": config["cache"]["shards"]},
        text=config["text"],
    )


def index_settings(wildcards):
    """cache_index's config: the one job given dataset.bad_audio as the config says.
    The shard jobs build the same bytes either way (they always leave a bad clip out and
    list it), so every other job's params give it as "skip" (pipeline.config.job_params,
    through _inline). Flipping it reruns the index (with `fail`, it records the bad clips
    and every job that reads it refuses) and those jobs, not a shard nor the aligner.
    These params are the ones _inline gave before: a run built before is up to date."""
    sections = dict(
        name=NAME,
        dataset=DS,
        cache=config["cache"],
        audio=config["audio"],
        text=config["text"],
        pitch=config["pitch"],
    )
    return json.dumps(pconfig.without_logging(sections), sort_keys=True)


def token_rows(wildcards):
    clips = MANIFEST[int(wildcards.shard)]
    return pshards.digest(PROVENANCE["tokens"], *(c.line for c in clips))


def _audio_job_dataset(shard):
    # val_fraction only changes cache_index (the statistics), never a mel or a pitch track;
    # a source's speaker and language never change audio
    if SOURCES:
        return {
            "bad_audio": DS["bad_audio"],
            "max_seconds": DS["max_seconds"],
            "sources": _shard_sources(shard, ("root", "format", "name")),
        }
    return {k: v for k, v in DS.items() if k != "val_fraction"}


def mel_settings(wildcards):
    return _inline(
        dataset=_audio_job_dataset(wildcards.shard),
        cache={"shards": config["cache"]["shards"]},
        audio=config["audio"],
    )


def pitch_settings(wildcards):
    return _inline(
        dataset=_audio_job_dataset(wildcards.shard),
        cache={"shards": config["cache"]["shards"]},
        **pshards.settings("pitch", config),
    )


if SOURCES:  # each clip names its own file
    AUDIO = {
        c.id: pmanifest.audio_stamp(c.audio) for cs in MANIFEST.values() for c in cs
    }
else:  # one directory scan, not 3 stats a clip
    # clip ids with several formats (LJ001-0001.wav and .flac): refused below
    AUDIO_TWINS = {}
    AUDIO = pmanifest.audio_files(DS["root"], DS["audio_dir"], AUDIO_TWINS)
try:  # an empty or unmounted audio folder: before any shard job rewrites its shards with no clip
    ppreflight.check_audio(config, MANIFEST, AUDIO, None if SOURCES else AUDIO_TWINS)
except perrors.PipelineError as e:
    stop_planning(e)
# a file whose timestamp alone moved (touch, a copy without -p) keeps the stamp its shard was keyed
# with: its bytes are compared with the memo's (pipeline/manifest.py, steady_stamps)
AUDIO, AUDIO_MEMO = pmanifest.steady_stamps(
    {c.id: AUDIO.get(c.id) for cs in MANIFEST.values() for c in cs},
    pmanifest.stamped_files(DS, MANIFEST, AUDIO),
    CACHE / pmanifest.STAMPS_FILE,
)


def record_stamps():
    """The memo steady_stamps made, once: here when the cache exists (a run with nothing to do calls no
    onstart, and the files read would be read again at every plan), else by the run that starts the
    first jobs (publish_clip_lists): a dry run or a lint of a fresh checkout makes no cache folder.
    """
    global AUDIO_MEMO
    pmanifest.write_stamps(
        CACHE / pmanifest.STAMPS_FILE,
        AUDIO_MEMO,
        log=lambda line: print(line, file=sys.stderr),
    )
    AUDIO_MEMO = None


# A SLURM job reads this Snakefile again on its node (Snakemake's remote mode): the memo stays what the
# submitting run's planning read, which its jobs' check_planned compares each clip's file with. A job
# that recorded what it found there hid a file changed while the job waited in the queue.
if CACHE.is_dir() and not workflow.remote_exec:
    record_stamps()
os.environ[pmanifest.STAMPS_ENV] = str((CACHE / pmanifest.STAMPS_FILE).resolve())
PROVENANCE = {kind: pshards.provenance(kind, config) for kind in pshards.CACHE_KINDS}


def publish_clip_lists():
    """Before the jobs start: the audio files' stamp memo (steady_stamps), and each shard's clips, from
    the manifest read above, where the shard jobs
    read theirs (pipeline/manifest.py, shard_manifest) instead of reading the whole dataset each.
    Unchanged data writes nothing. If it cannot be written, the jobs read the dataset as before.
    """
    record_stamps()
    dataset = {"sources": list(SOURCES.values())} if SOURCES else DS
    try:
        folder = pmanifest.write_clip_lists(
            MANIFEST, config["cache"]["shards"], CACHE / ".clips", dataset
        )
    except OSError as e:
        print(
            f"clip lists not written ({e}); shard jobs read the dataset",
            file=sys.stderr,
        )
        return
    os.environ[pmanifest.CLIP_LISTS_ENV] = str(folder.resolve())


# shard: its clips' entries, made once for both mel_shard and pitch_shard
_CLIP_FILES = {}


def _clip_files(kind, shard):
    # each clip's id, the file it resolves to, its size and mtime: adding, removing, renaming or
    # replacing a clip changes this, even a replacement moved in with an older mtime (mv, cp -p)
    if shard not in _CLIP_FILES:
        _CLIP_FILES[shard] = [f"{c.id}={AUDIO.get(c.id)}" for c in MANIFEST[int(shard)]]
    return pshards.digest(PROVENANCE[kind], *_CLIP_FILES[shard])


def mel_clips(wildcards):
    return _clip_files("mels", wildcards.shard)


def pitch_clips(wildcards):
    return _clip_files("pitch", wildcards.shard)


def repair(*kinds, root=CACHE):
    """Input function that makes a damaged shard's job stale: when a shard's .bin no longer has the
    size its JSON records (truncated, overwritten), planning writes a fresh marker,
    cache/{name}/.repair/{kind}-NNN (runs/{name}/.repair/ for the GTA shards: root=RUN), newer than
    the shard and with new content (Snakemake skips an
    mtime change when the checksum is the same), so the mtime trigger reruns exactly that job. A
    marker, once made, stays listed so the input set does not change again. Nothing is deleted.
    A job with some of its files deleted (a .bin, a .stats.npy, the energy shard) is damaged too:
    cache_index lists only the token, mel and pitch JSON files, so no one else would ask for them.
    While another Snakemake holds this folder's lock (`snakemake -n` beside a running build), no
    marker is written: a shard it is writing is not damaged.
    """

    def inputs(wildcards):
        marker, _ = mark_damaged(kinds, root, wildcards.shard)
        return [marker] if marker.exists() else []

    return inputs


def mark_damaged(kinds, root, shard):
    """repair's check of one job's shards: (its marker, whether they are damaged now, when a fresh
    marker was written)."""
    marker = root / ".repair" / f"{kinds[0]}-{shard}"
    damaged = (
        not ANOTHER_RUN
        and pshards.intact(*(pshards.prefix(root, kind, shard) for kind in kinds))
        != "ok"
    )
    if damaged:
        pfiles.atomic_write_text(marker, f"damaged shard found at {time.time_ns()}\n")
    return marker, damaged
