"""Everything that turns a mel into a waveform, in one folder (docs/vocoder.md):

    kinds.py          the kinds behind one interface (`vocoder.kind`), their registry, loading a run's vocoder
    griffin_lim.py    Griffin-Lim (no training), eager and as a graph for exports
    vocos.py          Vocos: a frame-rate network predicting STFT magnitude and phase
    hifigan.py        HiFi-GAN's generator (v1 / v2)
    discriminators.py the multi-resolution spectral, adversarial and feature-matching losses
    segments.py       the training crops: (mel, audio) pairs from the shard caches, no Python op
    gta.py            `gta_shard`: teacher-forced mels of the acoustic model, for fine-tuning
    train.py          `train_vocoder` / `finetune_vocoder`
    vocode.py         copy-synthesis of a mel file (`python -m pipeline.vocode`)
"""
