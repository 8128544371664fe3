"""`python -m pipeline.vocode --config C --mel M.npy --out W.wav`: the command's name; the code is
pipeline/vocoder/vocode.py."""
from pipeline.vocoder.vocode import main

if __name__ == "__main__":
    main()
