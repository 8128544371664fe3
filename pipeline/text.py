"""English text front end: cleaners, the one symbol list, and text <-> id conversion.

Cleaners are small one-purpose functions; `CLEANERS` composes them into named pipelines, and the
config's `text.cleaners` picks one by name:
  - "english": transliterate to ASCII, lowercase, spell out numbers and money, expand
    abbreviations, collapse whitespace. Use it for English corpora such as LJSpeech.
  - "basic":   lowercase and collapse whitespace only, for text that is already spelled out.
Add a language by writing its cleaners here and one more entry in `CLEANERS`.

`SYMBOLS` is the model's whole vocabulary (pad "_" = 0, end-of-sequence "~" = 1, punctuation,
letters); every id comes from its position. Editing it changes every id, so the token caches
rebuild and old checkpoints no longer fit; tests/test_text.py pins one sentence's ids so such an
edit is never silent. `vocabulary()` is saved as JSON beside the caches so that training and
synthesis read the same one.

Debug run: python -m pipeline.text --cleaners english "Dr. Smith paid $5.50 on May 1st, 1865."
"""
import argparse
import re
import unicodedata

# --- symbols ---------------------------------------------------------------------------------
PAD = "_"
EOS = "~"
_PUNCTUATION = "!'(),-.:;? "
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
SYMBOLS = [PAD, EOS, *_PUNCTUATION, *_LETTERS]

_SYMBOL_TO_ID = {s: i for i, s in enumerate(SYMBOLS)}
PAD_ID = _SYMBOL_TO_ID[PAD]
EOS_ID = _SYMBOL_TO_ID[EOS]
assert len(_SYMBOL_TO_ID) == len(SYMBOLS), "SYMBOLS has a duplicate"
assert (PAD_ID, EOS_ID) == (0, 1), "pad and eos must stay ids 0 and 1"

# --- cleaners --------------------------------------------------------------------------------
# Characters NFKD leaves alone but that have a usual ASCII spelling.
_ASCII_TABLE = str.maketrans({
    "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ß": "ss", "ø": "o", "Ø": "O", "ð": "d",
    "Ð": "D", "þ": "th", "Þ": "Th", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D",
    "‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"', "«": '"', "»": '"',
    "–": "-", "—": " - ", "…": "...", "\u00a0": " ",
})

# Whole abbreviation followed by its period (the period is part of the abbreviation).
_ABBREVIATIONS = [(re.compile(rf"\b{abbr}\.", re.IGNORECASE), word) for abbr, word in [
    ("mrs", "misess"), ("mr", "mister"), ("drs", "doctors"), ("dr", "doctor"), ("st", "saint"),
    ("co", "company"), ("jr", "junior"), ("maj", "major"), ("gen", "general"),
    ("rev", "reverend"), ("lt", "lieutenant"), ("hon", "honorable"), ("sgt", "sergeant"),
    ("capt", "captain"), ("esq", "esquire"), ("ltd", "limited"), ("col", "colonel"),
    ("ft", "fort"),
]]

_WHITESPACE_RE = re.compile(r"\s+")
# A money amount's whole part: comma-grouped or plain, so "$5, then" keeps its comma.
_AMOUNT = r"(\d{1,3}(?:,\d{3})+|\d+)"
# "$2.5 million": the unit word goes after the scale word.
_MONEY_SCALE_RE = re.compile(rf"([$£]){_AMOUNT}(\.\d+)? (thousand|million|billion|trillion)\b")
# "$1,000.50", "£5": whole part, optional fraction.
_DOLLARS_RE = re.compile(rf"\${_AMOUNT}(?:\.(\d+))?")
_POUNDS_RE = re.compile(rf"£{_AMOUNT}(?:\.(\d+))?")
# "13,100" and "1,234.5"; a bare "1865" is left to _NUMBER_RE, which reads it as a year.
_GROUPED_RE = re.compile(r"\b\d{1,3}(?:,\d{3})+(?:\.\d+)?\b")
_DECIMAL_RE = re.compile(r"\b\d+\.\d+\b")
_ORDINAL_RE = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b", re.IGNORECASE)
_NUMBER_RE = re.compile(r"\d+")

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ["", " thousand", " million", " billion", " trillion", " quadrillion"]
_ORDINAL_IRREGULAR = {"one": "first", "two": "second", "three": "third", "five": "fifth",
                      "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}


def _hundreds_to_words(n: int) -> str:
    """Words for 1 <= n <= 999."""
    hundreds, rest = divmod(n, 100)
    words = [f"{_ONES[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, ones = divmod(rest, 10)
        words.append(_TENS[tens] + (f"-{_ONES[ones]}" if ones else ""))
    elif rest:
        words.append(_ONES[rest])
    return " ".join(words)


def number_to_words(n: int) -> str:
    """Cardinal words: 1234 -> "one thousand two hundred thirty-four"."""
    if n < 0:
        return "minus " + number_to_words(-n)
    if n >= 1000 ** len(_SCALES):  # beyond the named scales: read digit by digit
        return " ".join(_ONES[int(d)] for d in str(n))
    if n == 0:
        return "zero"
    groups, scale = [], 0
    while n:
        n, group = divmod(n, 1000)
        if group:
            groups.append(_hundreds_to_words(group) + _SCALES[scale])
        scale += 1
    return " ".join(reversed(groups))


def ordinal_to_words(n: int) -> str:
    """Ordinal words: 22 -> "twenty-second"."""
    head, last = re.fullmatch(r"(.*[ -])?([a-z]+)", number_to_words(n)).groups()
    if last in _ORDINAL_IRREGULAR:
        last = _ORDINAL_IRREGULAR[last]
    elif last.endswith("y"):
        last = last[:-1] + "ieth"
    else:
        last += "th"
    return (head or "") + last


def year_to_words(n: int) -> str:
    """Year reading for 1000 < n < 3000: 1865 -> "eighteen sixty-five", 1900 -> "nineteen hundred"."""
    century, rest = divmod(n, 100)
    if n % 1000 == 0 or 2000 < n < 2010:
        return number_to_words(n)
    if rest == 0:
        return f"{number_to_words(century)} hundred"
    if rest < 10:
        return f"{number_to_words(century)} oh {number_to_words(rest)}"
    return f"{number_to_words(century)} {number_to_words(rest)}"


def _decimal_to_words(digits: str) -> str:
    whole, _, fraction = digits.replace(",", "").partition(".")
    words = number_to_words(int(whole))
    if fraction:
        words += " point " + " ".join(_ONES[int(d)] for d in fraction)
    return words


def _money_to_words(whole: str, fraction: str | None, unit: str, units: str,
                    sub: str, subs: str) -> str:
    amount = int(whole.replace(",", ""))
    cents = int((fraction or "0")[:2].ljust(2, "0"))  # "$1.5" is one dollar fifty
    parts = []
    if amount or not cents:
        parts.append(f"{number_to_words(amount)} {unit if amount == 1 else units}")
    if cents:
        parts.append(f"{number_to_words(cents)} {sub if cents == 1 else subs}")
    return ", ".join(parts)


def _money_scale_to_words(match: re.Match) -> str:
    symbol, whole, fraction, scale = match.groups()
    unit = "dollars" if symbol == "$" else "pounds"
    return f"{_decimal_to_words(whole + (fraction or ''))} {scale} {unit}"


def _number_to_words_or_year(match: re.Match) -> str:
    n = int(match.group(0))
    return year_to_words(n) if 1000 < n < 3000 else number_to_words(n)


def convert_to_ascii(text: str) -> str:
    """Transliterate to ASCII (é -> e, æ -> ae, curly quotes -> straight); other characters stay
    for text_to_ids to drop and count (and "£" stays for expand_numbers)."""
    text = unicodedata.normalize("NFKD", text.translate(_ASCII_TABLE))
    return "".join(c for c in text if not unicodedata.combining(c))


def lowercase(text: str) -> str:
    """Lowercase everything."""
    return text.lower()


def collapse_whitespace(text: str) -> str:
    """Turn every run of whitespace into one space and trim both ends."""
    return _WHITESPACE_RE.sub(" ", text).strip()


def expand_abbreviations(text: str) -> str:
    """Spell out common English abbreviations: "Mr." -> "mister", "St." -> "saint"."""
    for regex, word in _ABBREVIATIONS:
        text = regex.sub(word, text)
    return text


def expand_numbers(text: str) -> str:
    """Spell out money, grouped numbers, decimals, ordinals, years and cardinals."""
    text = _MONEY_SCALE_RE.sub(_money_scale_to_words, text)
    text = _DOLLARS_RE.sub(lambda m: _money_to_words(*m.groups(), "dollar", "dollars",
                                                     "cent", "cents"), text)
    text = _POUNDS_RE.sub(lambda m: _money_to_words(*m.groups(), "pound", "pounds",
                                                    "penny", "pence"), text)
    text = _GROUPED_RE.sub(lambda m: _decimal_to_words(m.group(0)), text)
    text = _DECIMAL_RE.sub(lambda m: _decimal_to_words(m.group(0)), text)
    text = _ORDINAL_RE.sub(lambda m: ordinal_to_words(int(m.group(1))), text)
    return _NUMBER_RE.sub(_number_to_words_or_year, text)


# --- pipelines -------------------------------------------------------------------------------
CLEANERS = {
    "basic": (lowercase, collapse_whitespace),
    "english": (convert_to_ascii, lowercase, expand_numbers, expand_abbreviations,
                collapse_whitespace),
}


def _pipeline(cleaners: str):
    if cleaners not in CLEANERS:
        raise ValueError(f"unknown text cleaners {cleaners!r}; valid names: "
                         f"{', '.join(sorted(CLEANERS))}")
    return CLEANERS[cleaners]


def clean_text(text: str, cleaners: str) -> str:
    """Run the named cleaner pipeline over text."""
    for cleaner in _pipeline(cleaners):
        text = cleaner(text)
    return text


# --- ids -------------------------------------------------------------------------------------
def text_to_ids(text: str, cleaners: str) -> tuple[list[int], int]:
    """Ids of the cleaned text followed by EOS_ID, and how many characters were dropped because
    the vocabulary lacks them (pad and eos characters in the text count as dropped too)."""
    cleaned = clean_text(text, cleaners)
    ids = [_SYMBOL_TO_ID[c] for c in cleaned if c in _SYMBOL_TO_ID and c not in (PAD, EOS)]
    return ids + [EOS_ID], len(cleaned) - len(ids)


def ids_to_text(ids) -> str:
    """Text of an id sequence, skipping pad and eos."""
    chars = []
    for i in map(int, ids):
        if not 0 <= i < len(SYMBOLS):
            raise ValueError(f"id {i} is outside the vocabulary (0..{len(SYMBOLS) - 1})")
        if i not in (PAD_ID, EOS_ID):
            chars.append(SYMBOLS[i])
    return "".join(chars)


def vocabulary(cleaners: str) -> dict:
    """What a model's ids mean; saved as JSON beside the caches and checked by synthesis."""
    _pipeline(cleaners)  # an unknown name fails here, not after a whole cache build
    return {"symbols": list(SYMBOLS), "pad_id": PAD_ID, "eos_id": EOS_ID, "cleaners": cleaners}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Show the cleaned text and ids of a sentence.")
    parser.add_argument("text")
    parser.add_argument("--cleaners", default="english", choices=sorted(CLEANERS))
    args = parser.parse_args()
    ids, dropped = text_to_ids(args.text, args.cleaners)
    print(clean_text(args.text, args.cleaners))
    print(ids, f"({dropped} dropped)")
