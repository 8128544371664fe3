"""The fixed symbol inventory of each text front end: what a model's token ids mean.

Ids never depend on the corpus: a symbol's id is its position in the front end's list below, pad
"_" = 0 and end-of-sequence "~" = 1 first. New data can therefore never shift an id, and a model
trained on one corpus reads another's tokens the same way. A symbol outside the list is not
dropped: the clip is rejected with the symbol named (pipeline/cache.py), and synthesis refuses
the sentence (pipeline/text.py). Editing a list changes every id after the edit: it is a text-code
change (every token_shard reruns, and a run trained on the old list refuses to resume);
tests/test_text.py pins one sentence's ids so an edit fails loudly.

    from pipeline import symbols
    symbols.inventory("phonemes")   # ["_", "~", " ", "!", ...]
"""
PAD, EOS = "_", "~"
PAD_ID, EOS_ID = 0, 1

# Punctuation both front ends keep (the phonemes front end puts espeak-ng's dropped marks back).
_PUNCTUATION = " !'(),-.:;?\"¡¿—…«»“”"

# characters: the cleaned lowercase letters (cleaners "english" and "basic" lowercase everything).
_LETTERS = "abcdefghijklmnopqrstuvwxyz"

# phonemes: the IPA espeak-ng writes through phonemizer, for every voice: letters of the IPA chart
# (pulmonic and other consonants, clicks, implosives, vowels) and espeak-ng's own (ᵻ ᵿ ɚ ɝ ɫ ...).
_IPA_LETTERS = (
    "abcdefghijklmnopqrstuvwxyz"
    "æçðøħŋœɐɑɒɓɔɕɖɗɘəɚɛɜɝɞɟɠɡɢɣɤɥɦɧɨɪɫɬɭɮɯɰɱɲɳɴɵɶɸɹɺɻɽɾʀʁʂʃʄʈʉʊʋʌʍʎʏʐʑʒʔʕʘʙʛʜʝʟʡʢ"
    "ǀǁǂǃβθχⱱᵻᵿäëïöüãõ"
)
# stress, length, tones (espeak-ng's digits and the IPA tone letters), modifier letters and the
# combining diacritics espeak-ng attaches to a preceding letter (nasal, syllabic, dental, ...).
_IPA_MARKS = (
    "ˈˌːˑ|‖‿"
    "123456˥˦˧˨˩"
    "ʰʱʲʷˠˤ˞ʼⁿˡ"
    "\u0303\u0329\u032f\u032a\u031e\u031d\u031f\u0320\u0325\u032c\u031a\u0306\u0308\u0361\u0330\u0324\u0339\u031c"
)

_FRONT_END = {
    "characters": _LETTERS + _PUNCTUATION,
    "phonemes": _IPA_LETTERS + _IPA_MARKS + _PUNCTUATION,
}


def inventory(frontend):
    """The front end's symbols in id order: pad, eos, then its fixed list (never the corpus's)."""
    chars = _FRONT_END[frontend]
    assert len(set(chars)) == len(chars), f"{frontend}: a symbol is listed twice"
    assert PAD not in chars and EOS not in chars
    return [PAD, EOS, *chars]
