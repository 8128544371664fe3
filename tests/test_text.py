"""Tests for pipeline/text.py: pinned ids, each cleaner, dropped characters, unknown cleaners."""
import json

import pytest

from pipeline import text
from pipeline.text import (EOS_ID, PAD_ID, SYMBOLS, clean_text, collapse_whitespace,
                           convert_to_ascii, expand_abbreviations, expand_numbers, ids_to_text,
                           lowercase, text_to_ids, vocabulary)


def test_pinned_ids():
    # Hand-checked once; if this fails, the symbol list changed and every cache and checkpoint
    # made before the change is stale.
    ids, dropped = text_to_ids("Printing, in the only sense -- isn't it (mostly)? Yes: a; b! z.",
                               "basic")
    assert ids == [28, 30, 21, 26, 32, 21, 26, 19, 6, 12, 21, 26, 12, 32, 20, 17, 12, 27, 26, 24,
                   37, 12, 31, 17, 26, 31, 17, 12, 7, 7, 12, 21, 31, 26, 3, 32, 12, 21, 32, 12, 4,
                   25, 27, 31, 32, 24, 37, 5, 11, 12, 37, 17, 31, 9, 12, 13, 10, 12, 14, 2, 12,
                   38, 8, 1]
    assert dropped == 0


def test_symbols():
    assert (PAD_ID, EOS_ID) == (0, 1)
    assert SYMBOLS[:2] == ["_", "~"]
    assert "".join(SYMBOLS[2:]) == "!'(),-.:;? abcdefghijklmnopqrstuvwxyz"
    assert len(set(SYMBOLS)) == len(SYMBOLS) == 39


@pytest.mark.parametrize("raw, spoken", [
    ("in 1865", "in eighteen sixty-five"),
    ("from 1900 to 1905", "from nineteen hundred to nineteen oh five"),
    ("in 2000 and 2005", "in two thousand and two thousand five"),
    ("in 1000 years", "in one thousand years"),
    ("the 22nd of November", "the twenty-second of November"),
    ("1st, 2nd, 3rd, 4th, 11th, 12th, 21st, 40th, 100th",
     "first, second, third, fourth, eleventh, twelfth, twenty-first, fortieth, one hundredth"),
    ("$5.50, then $1 and $0.05", "five dollars, fifty cents, then one dollar and five cents"),
    ("$1,000,000", "one million dollars"),
    ("$2.5 million", "two point five million dollars"),
    ("£3, or £1.01", "three pounds, or one pound, one penny"),
    ("13,100 clips", "thirteen thousand one hundred clips"),
    ("1,234.5", "one thousand two hundred thirty-four point five"),
    ("3.14 inches", "three point one four inches"),
    ("6 shots, 0 hits, 15 men, 99 days, 347 rooms", "six shots, zero hits, fifteen men, "
     "ninety-nine days, three hundred forty-seven rooms"),
    ("1000000007", "one billion seven"),
    ("no digits here.", "no digits here."),
])
def test_expand_numbers(raw, spoken):
    assert expand_numbers(raw) == spoken


def test_number_words():
    assert text.number_to_words(0) == "zero"
    assert text.number_to_words(110) == "one hundred ten"
    assert text.number_to_words(3000) == "three thousand"
    assert text.ordinal_to_words(1000) == "one thousandth"
    assert text.year_to_words(1963) == "nineteen sixty-three"


@pytest.mark.parametrize("raw, spoken", [
    ("Mr. Neild and Mrs. Fry", "mister Neild and misess Fry"),
    ("Dr. Smith and Drs. Jones", "doctor Smith and doctors Jones"),
    ("St. Giles, Gen. Walker, Capt. Cook, Lt. Day", "saint Giles, general Walker, "
     "captain Cook, lieutenant Day"),
    ("Ft. Worth; Col. Bell; Sgt. Hill; Hon. Rev. Ward, Esq.", "fort Worth; colonel Bell; "
     "sergeant Hill; honorable reverend Ward, esquire"),
    ("Smith & Co. Ltd. and J. Smith Jr.; Maj. Ames", "Smith & company limited and J. Smith "
     "junior; major Ames"),
    ("the mrs. said", "the misess said"),
    ("Mister Drake stayed", "Mister Drake stayed"),  # words merely starting with "dr"/"st"
])
def test_expand_abbreviations(raw, spoken):
    assert expand_abbreviations(raw) == spoken


def test_convert_to_ascii():
    assert convert_to_ascii("café, naïve, Müller, à la, fête") == "cafe, naive, Muller, a la, fete"
    assert convert_to_ascii("Æsop, encyclopædia, Straße, œuvre, Søren") == \
        "AEsop, encyclopaedia, Strasse, oeuvre, Soren"
    assert convert_to_ascii("‘Yes,’ he said, “it is” – fine…") == \
        "'Yes,' he said, \"it is\" - fine..."
    assert convert_to_ascii("£5 and 漢") == "£5 and 漢"  # left for expand_numbers / dropping


def test_lowercase_and_whitespace():
    assert lowercase("The Exhibition") == "the exhibition"
    assert collapse_whitespace("  in  being\tcomparatively \n modern. ") == \
        "in being comparatively modern."


def test_english_pipeline():
    raw = "Mr. Müller paid £5 on the 3rd of May, 1865 — “twice”."
    assert clean_text(raw, "english") == \
        "mister muller paid five pounds on the third of may, eighteen sixty-five - \"twice\"."
    assert clean_text("  Mr.   Neild ", "basic") == "mr. neild"


def test_dropped_characters_are_counted():
    ids, dropped = text_to_ids('He said "no" [sic] & left', "english")
    assert dropped == 5  # two quotes, two brackets, one ampersand
    assert ids_to_text(ids) == "he said no sic  left"
    assert ids[-1] == EOS_ID
    # pad and eos characters in the text are not smuggled in as pad / eos ids
    ids, dropped = text_to_ids("a_b~c", "basic")
    assert (ids, dropped) == ([13, 14, 15, EOS_ID], 2)


def test_round_trip():
    raw = "the invention of movable metal letters in the middle of the fifteenth century."
    ids, dropped = text_to_ids(raw, "english")
    assert dropped == 0
    assert ids_to_text(ids) == raw
    assert ids_to_text([PAD_ID, *ids, PAD_ID, PAD_ID]) == raw  # padding is skipped
    with pytest.raises(ValueError, match="outside the vocabulary"):
        ids_to_text([len(SYMBOLS)])


@pytest.mark.parametrize("call", [
    lambda: clean_text("x", "englsh"),
    lambda: text_to_ids("x", "english_cleaners"),
    lambda: vocabulary("transliteration"),
])
def test_unknown_cleaners(call):
    with pytest.raises(ValueError, match="valid names: basic, english"):
        call()


def test_vocabulary_is_json():
    vocab = json.loads(json.dumps(vocabulary("english")))
    assert vocab == {"symbols": SYMBOLS, "pad_id": 0, "eos_id": 1, "cleaners": "english"}
    vocab["symbols"].append("#")  # the caller's copy, not the module's list
    assert len(SYMBOLS) == 39
