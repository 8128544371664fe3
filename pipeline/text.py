"""Text front end: cleaners, then phonemes (espeak-ng) or characters, then symbols and ids.

Cleaners are small one-purpose functions; `CLEANERS` composes them into named pipelines, and the
config's `text.cleaners` picks one by name:
  - "english": transliterate to ASCII, lowercase, spell out numbers and money, expand
    abbreviations, collapse whitespace. Use it for English corpora such as LJSpeech.
  - "basic":   lowercase and collapse whitespace only, for text that is already spelled out.
Add a language by writing its cleaners here and one more entry in `CLEANERS`.

`text.frontend` then turns the cleaned text into symbols (one Unicode character each):
  - "phonemes" (default): espeak-ng's IPA through the `phonemizer` package's espeak backend (the
    maintained binding the field's trainers use), voice `text.language`, with punctuation, stress
    marks and word boundaries (spaces) kept. One backend per process: creating one per line costs
    ~50-190 ms. espeak-ng's output changes between versions, so its version is part of the token
    shards' provenance (a new espeak-ng rebuilds them and nothing else). espeak-ng stops reading a
    word after about 130 letters: a longer run of letters is read in parts (cut_long_words).
  - "characters": the cleaned letters and punctuation themselves.

Ids never depend on the corpus: each front end has a fixed, ordered symbol inventory
(pipeline/symbols.py; pad "_" = 0, end-of-sequence "~" = 1). `vocabulary(text_cfg)` is that list
with the front end's settings; cache_index saves it in index.json and vocab.json, and a run keeps
its own copy (pipeline/runinfo.py). `check_line` says why a line cannot be trained on or spoken:
letters of another script than `text.language`'s, emoji and other pictographs (espeak-ng would read
them out as "arabic letter seen", "grinning face" in the corpus's voice), a phoneme or letter outside
the inventory, or no sound at all. Token shards reject such clips with that reason; `encode(text,
vocab)` raises it as a TextError naming the characters.

Debug run: python -m pipeline.text "Dr. Smith paid $5.50 on May 1st, 1865."   (--frontend characters)
The ids an exported model takes: python -m pipeline.text --ids "Hello there." [--run runs/demo | --config my.yaml]
[--language en-gb] (a model of several languages: the sentence in another of its languages' voice)
"""
import argparse
import functools
import json
import logging
import math
import re
import sys
import unicodedata

from pipeline import symbols as _symbols
from pipeline.errors import PipelineError, cli

# --- symbols ---------------------------------------------------------------------------------
PAD, EOS, PAD_ID, EOS_ID = _symbols.PAD, _symbols.EOS, _symbols.PAD_ID, _symbols.EOS_ID
CHARACTERS = "".join(_symbols.inventory("characters")[2:])  # what the characters front end keeps
FRONTENDS = ("phonemes", "characters")
# punctuation espeak-ng would drop; phonemizer puts it back between the words
_PUNCTUATION_MARKS = ';:,.!?¡¿—…"«»“”()'
_NOT_SPOKEN = set(_PUNCTUATION_MARKS + "'- ")  # a line of only these says nothing
# espeak-ng reads at most about 130 letters of one word, and about 40 of one it spells letter by letter
# ("xxxx..."), and says nothing of the rest: a longer run of letters is read in parts of at most this many
LONGEST_WORD = 36
_LONG_WORD = re.compile(r"[^\W\d_]{%d,}" % (LONGEST_WORD + 1))

# Scripts other than Latin that a voice reads (the voice's code before "-" -> Unicode script names).
# Latin letters pass in every voice (names, loanwords); letters of any other script do not.
_SCRIPTS = {
    **dict.fromkeys(("ru", "uk", "be", "bg", "mk", "sr", "kk", "ky", "tt", "ba", "cv", "mn"), ("CYRILLIC",)),
    **dict.fromkeys(("ar", "fa", "ur", "ps", "sd", "ug"), ("ARABIC",)),
    **dict.fromkeys(("hi", "mr", "ne", "sa", "kok", "mai"), ("DEVANAGARI",)),
    **dict.fromkeys(("cmn", "yue", "hak", "zh"), ("CJK",)),
    "el": ("GREEK",), "grc": ("GREEK",), "he": ("HEBREW",), "bn": ("BENGALI",), "as": ("BENGALI",),
    "bpy": ("BENGALI",), "pa": ("GURMUKHI",), "gu": ("GUJARATI",), "or": ("ORIYA",), "ta": ("TAMIL",),
    "te": ("TELUGU",), "kn": ("KANNADA",), "ml": ("MALAYALAM",), "si": ("SINHALA",), "ka": ("GEORGIAN",),
    "hy": ("ARMENIAN",), "am": ("ETHIOPIC",), "my": ("MYANMAR",), "ja": ("CJK", "HIRAGANA", "KATAKANA"),
    "ko": ("HANGUL",),
}


class TextError(PipelineError):
    """Text that cannot become ids: another script, a symbol outside the inventory, no sound, or no espeak-ng."""


# --- cleaners --------------------------------------------------------------------------------
# Characters NFKD leaves alone but that have a usual ASCII spelling.
_ASCII_TABLE = str.maketrans({
    "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ß": "ss", "ø": "o", "Ø": "O", "ð": "d",
    "Ð": "D", "þ": "th", "Þ": "Th", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D",
    "‘": "'", "’": "'", "‚": "'", "“": '"', "”": '"', "„": '"', "«": '"', "»": '"',
    "–": "-", "—": " - ", "…": "...", "\u00a0": " ",
    "≠": " not equal to ",  # NFKD makes it "=" and a mark that is then dropped: "equals"
})

# Whole abbreviation followed by its period (the period is part of the abbreviation).
_ABBREVIATIONS = [(re.compile(rf"\b{abbr}\.", re.IGNORECASE), word) for abbr, word in [
    ("mrs", "misess"), ("mr", "mister"), ("drs", "doctors"), ("dr", "doctor"), ("st", "saint"),
    ("co", "company"), ("jr", "junior"), ("sr", "senior"), ("maj", "major"), ("gen", "general"),
    ("rev", "reverend"), ("lt", "lieutenant"), ("hon", "honorable"), ("sgt", "sergeant"),
    ("capt", "captain"), ("esq", "esquire"), ("ltd", "limited"), ("col", "colonel"),
    ("ft", "fort"),
]]

# "St." and "Dr." after a capitalised word or an ordinal ("Main St.", "5th St.", "Elm Dr.") name a
# street or a drive, unless a capitalised word that is not a sentence's usual first word follows
# ("Bury St. Edmunds", "Jekyll and Dr. Hyde", "Dr. A. Smith" stay saint and doctor), "Dr." comes
# before a name's particle ("Dr. van Helsing"), the word before is a greeting, an article or a
# possessive ("Hi Dr.,", "The Dr. said", "My Dr. is") or a title ("Minister Dr. Abiy"). A compass
# point's letters or a unit word after it are no name ("21st St. NW", "Oak Dr. Suite 200"; a lone
# N, S, E, W before a period or a capitalised word is an initial: "Dr. E. Smith", "Dr. S Jaishankar";
# "North" and "West" are surnames too: "Dr. West" stays a doctor). "Dr." after "Jr." or "Sr." is a
# drive ("Martin Luther King Jr. Dr.", but "Sr. Dr. Garcia" still a doctor). A house number (a letter
# may follow it, not a decade's "s") before one or two capitalised words makes an address: a
# capitalised word may follow ("123 Main St. Springfield", "221B Baker St. London, UK", "1600 Old Mill
# Dr. Austin") unless a lower-case word comes after it ("In 1850 Bury St. Edmunds grew", "At 5 PM
# Dr. Smith will") or it is a possessive ("5 St. Mark's Place"), and a month or AM/PM after the number
# is a date or a time ("On 17 March St. Patrick's", "On 5 March Dr. Smith."). A count of a headline's
# plural noun is no house number ("5 Things Dr. Fauci Wants", "10 Reasons St. Louis Is Great"). After
# "St." a compass word is part of the address ("Main St. North": no saint is named North; "Dr. West"
# stays a doctor). Before a sentence's usual first word ("Main St. My sister": after "St." a possessive
# or a pronoun too, no name) or at the end (closing quotes or brackets between), and before an
# ellipsis's other dots, the period also ends the sentence and stays. A greeting before "Dr." is no
# street's name ("Good Morning Dr. The results are in."). One pass over the text: an
# attempt starts only where a run of word characters, hyphens and apostrophes does (opening
# apostrophes are part of it), and reads at most five words.
_STARTERS = (r"(?:The|An|A(?!\.)|I(?!\.)|He|She|It|We|They|You|This|That|These|Those|There|Then|In|On|At|But|And|"
             r"So|If|When)\b")
# ... and after a street (not after "Dr.": "Dr. Her", "Dr. How Kim Lee" are names; "Good Morning Dr. How
# are you?" a doctor), possessives, pronouns, question words and days: "Main St. My sister lives".
_STREET_STARTERS = (rf"(?:{_STARTERS}|(?:My|His|Her|Our|Your|Their|Its|What|Why|How|Where|Yes|Today|Tomorrow|"
                    rf"Yesterday|Later|Meanwhile|However)(?![\w'-]))")
_GREETINGS = r"(?:Morning|Evening|Afternoon|Night|Goodnight|Goodbye|Bye|Welcome|Congratulations|Congrats|Sure)\b"
_NOT_A_NAME = (r"(?:Hi|Hello|Hey|Dear|Thanks|Thank|Yes|No|Okay|Ok|Good|Sorry|The|A|An|My|Our|Your|His|Her|Their|Its|"
               r"This|That)\b")
_TITLES = (r"(?:Minister|Reverend|Rev|Professor|Prof|President|Senator|Governor|Chancellor|Secretary|Mayor|Judge|"
           r"Chief|General|Colonel|Captain|Sir|Dame|Lord|Lady)\b")
_DATES = (r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|Sept?(?:ember)?|"
          r"Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?|AM|PM|A\.M|P\.M)\b")
_PARTICLES = r"(?:van|von|de|der|den|da|di|du|la|le|del|della|ten|ter|al|el|bin|ibn)\b"
_ADDRESS_WORDS = (r"(?:[NSEW](?![\w.]|\s+[A-Z])|(?:[NS][EW]|Apt|Apartment|Suite|Unit|Room|Floor|Bldg|Building)\b|"
                  r"Ste\b(?!\.))")
_NAME = r"(?:[A-Z][\w'-]*|\d+(?i:st|nd|rd|th))"
_HEADLINE = (r"(?:Things?|(?:Reason|Way|Tip|Lesson|Fact|Sign|Question|Secret|Mistake|Rule|Step|Habit|Idea|Quote|Myth|"
             r"Takeaway|Moment|Surprise|Prediction|Trend|Trick|Hack|Photo|Picture|Book|Song|Movie|Film|Food|Time)s|"
             r"Stories)\b")
_FOLLOWS = r"[\"')\]]*\s+"   # after the abbreviation's period: closing quotes or brackets, then a space
_COMPASS = r"(?:North|South|East|West)\b"
_PLACES = [(re.compile(rf"(?<![\w'-])(?P<before>'*(?!{not_a_name})(?:(?P<number>\d+(?:(?!s )[A-Za-z])? (?!{_DATES})"
                       rf"(?!(?:[A-Z][\w'-]* )?{_HEADLINE})(?:[A-Z][\w'-]* )?)?(?!{_TITLES}){_NAME}{jr})) {abbr}\."
                       rf"(?(number)(?!{_FOLLOWS}(?:[A-Z][\w-]*'s\b|(?!{starters})[A-Z][\w'-]*\s+[a-z]))"
                       rf"|(?!{_FOLLOWS}(?!{starters}|{_ADDRESS_WORDS}{compass})[A-Z]){extra})"
                       rf"(?P<end>(?=[\"')\]]*(?:\s+{starters}|\s*$)|\.\.))?"), word)
           for abbr, word, jr, compass, extra, starters, not_a_name in [
               ("S[tT]", "street", "", f"|{_COMPASS}", "", _STREET_STARTERS, _NOT_A_NAME),
               ("D[rR]", "drive", r"|[JS][rR]\.", "", rf"(?!\s+{_PARTICLES})", _STARTERS, rf"{_NOT_A_NAME}|{_GREETINGS}")]]
# Street words: "5th Ave." -> avenue, "Sunset Blvd.", "Mulholland Rd." (not "RD", a dietitian), "Hwy.",
# and "Mt." before a name ("Mt. Hood"; not "MT" for Montana, "mt." for tonnes, nor "Mt. 5:3"). Their
# period stays where it ends a sentence: at the end, before an ellipsis's other dots, or (closing quotes
# or brackets between) before a sentence's usual first word (not "Ave. A in ...", a lettered avenue) or
# a capitalised word and then a lower-case one ("Sunset Blvd. Police said"; not "Park Ave. South is").
_STREET_END = (rf"(?P<end>(?=[\"')\]]*(?:\s+(?![AI]\s+(?:in|on|at|to|and|or|near|between|from|north|south|east|west)\b)"
               rf"(?:{_STREET_STARTERS}|(?!{_COMPASS}|{_ADDRESS_WORDS})[A-Z][a-z][\w'-]*\s+[a-z])|\s*$)|\.\.))?")
_STREETS = [(re.compile(rf"\b{abbr}\.{end}"), word)
            for abbr, word, end in [("(?i:ave)", "avenue", _STREET_END), ("(?i:blvd)", "boulevard", _STREET_END),
                                    ("[Rr]d", "road", _STREET_END), ("(?i:hwy)", "highway", _STREET_END),
                                    (r"Mt(?=\.\s+[A-Z])", "mount", "(?P<end>(?!))?")]]

_WHITESPACE_RE = re.compile(r"\s+")
# A money amount's whole part: comma-grouped or plain, so "$5, then" keeps its comma.
_AMOUNT = r"(\d{1,3}(?:,\d{3})+|\d+)"
# A country's dollars ("US$5", "A$5", "C$5"; lowercased): its words go before "dollars". Not after a
# letter or an apostrophe ("bus$5" keeps its "bus"); "a$5" reads as Australian too (lowercased, a
# typo of "a $5" looks the same).
_DOLLAR_COUNTRIES = {"us": "u s", "au": "australian", "a": "australian", "ca": "canadian", "c": "canadian",
                     "nz": "new zealand", "hk": "hong kong"}
_COUNTRY = r"(?:(?<![\w'])(%s)(?=\$))?" % "|".join(_DOLLAR_COUNTRIES)
# "$2.5 million": the unit word goes after the scale word.
_MONEY_SCALE_RE = re.compile(rf"{_COUNTRY}([$£]){_AMOUNT}(\.\d+)? (thousand|million|billion|trillion)\b")
# "$1,000.50", "£5": whole part, optional fraction.
_DOLLARS_RE = re.compile(rf"{_COUNTRY}\${_AMOUNT}(?:\.(\d+))?")
_POUNDS_RE = re.compile(rf"£{_AMOUNT}(?:\.(\d+))?")
# "13,100" and "1,234.5"; a bare "1865" is left to _NUMBER_RE, which reads it as a year.
_GROUPED_RE = re.compile(r"\b\d{1,3}(?:,\d{3})+(?:\.\d+)?\b")
# "1.5", also before letters ("1.5x", "-3.5c"), not a part of "2.5.3" (_DOTTED_RE reads those).
_DECIMAL_RE = re.compile(r"(?<![\d.])\d+\.\d+(?!\d|\.\d)")
# "2.5.3" (a version, an address): each part a number, "point" between ("two point five point three").
_DOTTED_RE = re.compile(r"(?<![\d.])\d+(?:\.\d+){2,}(?!\d|\.\d)")
# A sign, not a hyphen or a range: "-5", "(-3.5", "-$5", and after a currency sign "$-5" or "US$-5"
# (espeak-ng drops that one: "dollar five"), the sign put first; "5-6", "covid-19", "- 5" keep theirs.
_CURRENCY = r"(?:(?:%s)?\$|£)" % "|".join(_DOLLAR_COUNTRIES)
_MINUS_RE = re.compile(rf"(?<![\w.,$£-])(?:-(?={_CURRENCY}?\d)|({_CURRENCY})-(?=\d))")
# Primes after a number (convert_to_ascii has made "″" two "′"): after degrees, minutes and seconds of
# arc ("40°26′46″N": "forty degrees twenty-six minutes forty-six seconds north"), otherwise feet and
# inches ("5′11″"). Left ambiguous: a lone "30′" or "30′15″" with no degrees before it reads as feet
# and inches, though it may be arc or time; a prime after a letter ("f′") is left to espeak-ng, which
# says nothing for it.
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_ARC_RE = re.compile(rf"(?<![\d.,])({_NUMBER})°\s?({_NUMBER})′(?!′)(?:\s?({_NUMBER})′′(?!′))?(?:\s?([nsew])\b)?")
_FEET_INCHES_RE = re.compile(rf"(?<![\d.,])({_NUMBER})(′′|′)(?!′)")
_COMPASS_WORDS = {"n": "north", "s": "south", "e": "east", "w": "west"}
# "3·14": a middle dot between digits is a decimal point in some typography.
_MIDDLE_DOT_DECIMAL_RE = re.compile(r"(?<=\d)·(?=\d)")
# A bullet, "•" or a "·" standing apart ("· eggs · milk"), begins a list item: a comma's pause after a
# word, nothing at the start or after punctuation. A "·" inside a word ("l·l", "a·b") is left as it is.
# The match starts where a run of whitespace does (tried inside one, it was quadratic in the run).
_BULLET_RE = re.compile(r"(?:(?<!\s)\s+)?(?:•|(?<!\S)·|·(?!\S))\s*")
# "3:05", "12:00", "3:00pm", "11:30 a.m.": hours 0-23, minutes 00-59 (lowercased text).
_TIME_RE = re.compile(r"(?<![\d:])([01]?\d|2[0-3]):([0-5]\d)(?![\d:])(?:\s?([ap])\.?m\b\.?)?")
# A number run into a word ("1.5x", "4x4", "h2o"): a space between, but not before an ordinal's suffix
# or a plural "s" ("21st", "1860s"), which the number's words take.
_STUCK_RE = re.compile(r"(?<=[a-z])(?=\d)|(\d)(?!(?:st|nd|rd|th|s)\b)(?=[a-z])")
# Symbols the english cleaners spell out: "&" and "%" (espeak-ng reads them, the characters front end
# would drop them), and "<", ">", "‰" and "‱", which espeak-ng (1.51, en-us) drops without a word. "<" and
# ">" are a comparison alone, not in an arrow ("->", "<-", "=>"), "<=" or ">=" (espeak-ng reads those),
# "<>", "<<" or a tag ("<b>", "</p>", '<a href="x">': a name and name=value attributes, matched whole
# and kept, so its brackets are not read as comparisons): those stay as they are. Symbols no reader
# says ("|", "^", "_", brackets) stay too.
# The "&" match starts where a run of whitespace does: tried inside one, it was quadratic in the run.
_TAG = r"""</?[a-z][\w:-]*(?:\s+[a-z_:][\w:.-]*\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s"'<>=]+))*\s*/?>"""
_COMPARISON_RE = re.compile(r"(%s)|" % _TAG + r"(?<![<>=-])(?:(<)(?![<>=]|-(?!\d))|>(?![<>=]))", re.IGNORECASE)
_SYMBOL_WORDS = ((re.compile(r"(?:(?<!\s)\s+)?&\s*"), " and "), (re.compile(r"%"), " percent"),
                 (_COMPARISON_RE, lambda m: m[1] or (" less than " if m[2] else " greater than ")),
                 (re.compile("‰"), " per mille"), (re.compile("‱"), " per ten thousand"))
_ORDINAL_RE = re.compile(r"\b(\d+)(?:st|nd|rd|th)\b", re.IGNORECASE)
_NUMBER_RE = re.compile(r"\d+")
# A number as the cleaners read it: digits with grouping commas and decimal points.
_NUMBER_RUN_RE = re.compile(r"\d[\d,.]*")
MAX_DIGITS = 100  # a longer number is refused (problem), not read out: no one says 5,000 digits

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
    if fraction and len(fraction) > 2:  # "$1.999" is no number of cents: read as a decimal
        return f"{_decimal_to_words(whole + '.' + fraction)} {units}"
    amount = int(whole.replace(",", ""))
    cents = int((fraction or "0")[:2].ljust(2, "0"))  # "$1.5" is one dollar fifty
    parts = []
    if amount or not cents:
        parts.append(f"{number_to_words(amount)} {unit if amount == 1 else units}")
    if cents:
        parts.append(f"{number_to_words(cents)} {sub if cents == 1 else subs}")
    return ", ".join(parts)


def _money_scale_to_words(match: re.Match) -> str:
    country, symbol, whole, fraction, scale = match.groups()
    unit = _dollars(country, "dollars") if symbol == "$" else "pounds"
    return f"{_decimal_to_words(whole + (fraction or ''))} {scale} {unit}"


def _dollars(country: str | None, unit: str) -> str:
    return f"{_DOLLAR_COUNTRIES[country]} {unit}" if country else unit


def _arc_to_words(match: re.Match) -> str:
    degrees, minutes, seconds, compass = match.groups()
    words = f"{degrees} {_unit(degrees, 'degree')} {minutes} {_unit(minutes, 'minute')}"
    if seconds:
        words += f" {seconds} {_unit(seconds, 'second')}"
    return words + (f" {_COMPASS_WORDS[compass]}" if compass else "")


def _feet_inches_to_words(match: re.Match) -> str:
    number, prime = match.groups()
    return f"{number} " + (_unit(number, "inch", "inches") if prime == "′′" else _unit(number, "foot", "feet"))


def _unit(number: str, one: str, many: str | None = None) -> str:
    return one if number == "1" else (many or one + "s")


def _bullet(match: re.Match) -> str:
    before = match.string[match.start() - 1] if match.start() else " "  # a space: the bullet before took it
    return ", " if before not in " ,;:.!?…" and match.end() < len(match.string) else " "


def _time_to_words(match: re.Match) -> str:
    hours, minutes, half = int(match.group(1)), int(match.group(2)), match.group(3)
    words = number_to_words(hours)
    if minutes:
        words += (" oh " if minutes < 10 else " ") + number_to_words(minutes)
    elif not half:
        words += " o'clock"
    return words + (f" {half} m" if half else "")


def _dotted_to_words(match: re.Match) -> str:
    return " point ".join(number_to_words(int(part)) for part in match.group(0).split("."))


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


def expand_places(text: str) -> str:
    """Before lowercasing, which it needs: "Main St." -> "Main street.", "Elm Dr. is" -> "Elm drive is",
    "5th Ave. now" -> "5th avenue now";
    "St. Paul", "Bury St. Edmunds" and "Dr. Smith" are left to expand_abbreviations (_PLACES)."""
    for regex, word in _PLACES:
        text = regex.sub(lambda m, word=word: f"{m['before']} {word}" + ("." if m["end"] is not None else ""), text)
    for regex, word in _STREETS:
        text = regex.sub(lambda m, word=word: word + ("." if m["end"] is not None else ""), text)
    return text


def expand_abbreviations(text: str) -> str:
    """Spell out common English abbreviations: "Mr." -> "mister", "St." -> "saint"."""
    for regex, word in _ABBREVIATIONS:
        text = regex.sub(word, text)
    return text


def longest_number(text: str) -> int:
    """How many digits the longest number in `text` holds (grouping commas and points included)."""
    return max((sum(c.isdigit() for c in m.group(0)) for m in _NUMBER_RUN_RE.finditer(text)), default=0)


def expand_numbers(text: str) -> str:
    """Spell out signs, a middle dot's decimal point, bullets (a pause), degrees, minutes and seconds,
    feet and inches, times, money, grouped numbers, dotted numbers, decimals, ordinals, years and
    cardinals, then "&", "%", "<", ">", "‰" and "‱" (text holding a number of more than MAX_DIGITS
    digits stays as it is: `problem` refuses it)."""
    if longest_number(text) > MAX_DIGITS:
        return text
    text = _MINUS_RE.sub(lambda m: "minus " + (m[1] or ""), text)
    text = _MIDDLE_DOT_DECIMAL_RE.sub(".", text)
    text = _BULLET_RE.sub(_bullet, text)
    text = _ARC_RE.sub(_arc_to_words, text)
    text = _FEET_INCHES_RE.sub(_feet_inches_to_words, text)
    text = _TIME_RE.sub(_time_to_words, text)
    text = _STUCK_RE.sub(lambda m: (m.group(1) or "") + " ", text)
    text = _MONEY_SCALE_RE.sub(_money_scale_to_words, text)
    text = _DOLLARS_RE.sub(lambda m: _money_to_words(*m.groups()[1:], _dollars(m[1], "dollar"), _dollars(m[1], "dollars"),
                                                     "cent", "cents"), text)
    text = _POUNDS_RE.sub(lambda m: _money_to_words(*m.groups(), "pound", "pounds",
                                                    "penny", "pence"), text)
    text = _GROUPED_RE.sub(lambda m: _decimal_to_words(m.group(0)), text)
    text = _DOTTED_RE.sub(_dotted_to_words, text)
    text = _DECIMAL_RE.sub(lambda m: _decimal_to_words(m.group(0)), text)
    text = _ORDINAL_RE.sub(lambda m: ordinal_to_words(int(m.group(1))), text)
    text = _NUMBER_RE.sub(_number_to_words_or_year, text)
    for regex, words in _SYMBOL_WORDS:
        text = regex.sub(words, text)
    return text


# --- pipelines -------------------------------------------------------------------------------
CLEANERS = {
    "basic": (lowercase, collapse_whitespace),
    "english": (convert_to_ascii, expand_places, lowercase, expand_numbers, expand_abbreviations,
                collapse_whitespace),
}


def _pipeline(cleaners: str):
    if cleaners not in CLEANERS:
        raise TextError(f"unknown text cleaners {cleaners!r}; valid names: "
                         f"{', '.join(sorted(CLEANERS))}")
    return CLEANERS[cleaners]


def clean_text(text: str, cleaners: str) -> str:
    """Run the named cleaner pipeline over text."""
    for cleaner in _pipeline(cleaners):
        text = cleaner(text)
    return text


# --- front ends ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def espeak_version() -> str:
    """The version of the libespeak-ng that phonemizer loads (the same library: its
    PHONEMIZER_ESPEAK_LIBRARY, else the system's), e.g. "1.51". Asked of the library directly:
    0.04 s, where phonemizer's wrapper copies the library first (0.7 s), and planning asks too."""
    import ctypes
    import ctypes.util
    import os

    path = os.environ.get("PHONEMIZER_ESPEAK_LIBRARY") or ctypes.util.find_library("espeak-ng")
    try:
        info = ctypes.cdll.LoadLibrary(path).espeak_Info if path else None
    except OSError:
        info = None
    if info is None:
        raise TextError("text.frontend: phonemes needs the espeak-ng library (libespeak-ng1), not found; "
                        "run ./install.sh or set text.frontend: characters")
    info.restype = ctypes.c_char_p
    return info(None).decode().split()[0]


@functools.lru_cache(maxsize=1)
def espeak_languages() -> frozenset:
    """Every language code the espeak-ng library has a voice for (e.g. "en-us", "de"), asked of the
    library itself (about 30 ms), so planning can name a source's unknown language."""
    import ctypes
    import ctypes.util
    import os

    class _Voice(ctypes.Structure):  # espeak_VOICE (speak_lib.h)
        _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_void_p), ("identifier", ctypes.c_char_p),
                    ("gender", ctypes.c_ubyte), ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte),
                    ("xx1", ctypes.c_ubyte), ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]

    espeak_version()  # a missing library fails here with the install hint
    lib = ctypes.cdll.LoadLibrary(os.environ.get("PHONEMIZER_ESPEAK_LIBRARY") or ctypes.util.find_library("espeak-ng"))
    lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.espeak_Initialize(0x02, 0, None, 0)  # AUDIO_OUTPUT_SYNCHRONOUS: no audio device
    lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
    voices, out, i = lib.espeak_ListVoices(None), set(), 0
    while voices[i]:
        p = voices[i].contents.languages  # (priority byte, NUL-terminated code)*, then a 0 byte
        while ctypes.c_ubyte.from_address(p).value:
            code = ctypes.string_at(p + 1)
            out.add(code.decode().lower())
            p += len(code) + 2
        i += 1
    return frozenset(out)


@functools.lru_cache(maxsize=4)
def _backend(language):
    """One espeak backend per process and voice."""
    from phonemizer.backend import EspeakBackend
    quiet = logging.getLogger("pipeline.text.phonemizer")
    quiet.setLevel(logging.ERROR)
    espeak_version()  # a missing library fails here with the install hint
    try:
        return EspeakBackend(language, preserve_punctuation=True, with_stress=True,
                             punctuation_marks=_PUNCTUATION_MARKS, language_switch="remove-flags", logger=quiet)
    except RuntimeError as e:
        raise TextError(f"text.language: {e}") from None


def phonemize(lines, language):
    """espeak-ng IPA of each cleaned line: words separated by one space, punctuation and stress kept."""
    from phonemizer.separator import Separator
    lines = list(lines)
    spoken = [i for i, line in enumerate(lines) if line.strip()]  # phonemizer drops empty lines
    out = [""] * len(lines)
    if spoken:
        said = _backend(language).phonemize([lines[i] for i in spoken], separator=Separator(phone="", word=" ", syllable=""),
                                            strip=True, njobs=1)
        for i, p in zip(spoken, said):
            out[i] = collapse_whitespace(p)
    return out


def cut_long_words(line):
    """`line` with each run of more than LONGEST_WORD letters cut by spaces into equal parts of at most
    that many: read in parts, not cut short where espeak-ng stops reading a word (a chemical name,
    "aaaa...rgh"). Numbers are left whole (the cleaners read them out as words)."""
    def cut(m):
        word = m[0]
        size = math.ceil(len(word) / math.ceil(len(word) / LONGEST_WORD))  # equal parts, each at most LONGEST_WORD
        return " ".join(word[i:i + size] for i in range(0, len(word), size))
    return _LONG_WORD.sub(cut, line)


def to_symbols(lines, text_cfg):
    """[(symbols, dropped)] per line: the front end's symbol string and how many characters it
    dropped (pad and eos characters always; characters front end: punctuation and symbols outside
    its inventory; letters outside it are kept, for `problem` to name). The phonemes front end reads
    a word longer than LONGEST_WORD letters of the cleaned text in parts (cut_long_words), for a
    corpus line as for `speak`."""
    # a line `problem` refuses for its number is neither cleaned nor phonemized
    cleaned = [clean_text(line, text_cfg["cleaners"]) if longest_number(line) <= MAX_DIGITS else "" for line in lines]
    if text_cfg["frontend"] == "characters":
        allowed = set(CHARACTERS)
        keep = lambda c: c in allowed or unicodedata.category(c).startswith("L")  # noqa: E731
    else:
        cleaned = phonemize(map(cut_long_words, cleaned), text_cfg["language"])
        keep = lambda c: True  # noqa: E731
    out = []
    for line in cleaned:
        kept = "".join(c for c in line if c not in (PAD, EOS) and keep(c))
        out.append((kept, len(line) - len(kept)))
    return out


def says_nothing(symbols):
    """True when a symbol string holds no sound at all (only punctuation and spaces)."""
    return all(c in _NOT_SPOKEN for c in symbols)


def foreign_characters(line, language):
    """The characters of `line` that the `language` voice cannot say as words: letters of another
    script than the voice's (Latin always passes) and pictographs (emoji, other symbols)."""
    scripts = ("LATIN", *_SCRIPTS.get(language.split("-")[0].lower(), ()))
    out = []
    for c in unicodedata.normalize("NFKC", line):
        cat = unicodedata.category(c)
        if cat.startswith("L"):
            bad = unicodedata.name(c, "?").split()[0] not in scripts
        else:
            bad = cat in ("So", "Co", "Cn") or (cat == "Sk" and not c.isascii())
        if bad and c not in out:
            out.append(c)
    return out


def shown(line, limit=120):
    """`line` quoted for a message, its middle elided when longer than `limit` characters."""
    return repr(line) if len(line) <= limit else f"{line[:limit // 2]!r}...{line[-limit // 4:]!r} ({len(line)} characters)"


def _named(chars):
    return " ".join(f"{c!r} ({unicodedata.name(c, f'U+{ord(c):04X}').lower()})" for c in chars)


def problem(line, symbols, text_cfg):
    """Why `line`, whose front-end symbols are `symbols`, cannot be trained on or spoken; None when it can."""
    digits = longest_number(line)
    if digits > MAX_DIGITS:
        return f"a number of {digits} digits (more than {MAX_DIGITS} are not read out; write it in words)"
    foreign = foreign_characters(line, text_cfg["language"])
    if foreign:
        return (f"{_named(foreign)} not in the script of text.language {text_cfg['language']} "
                f"(its voice would read them out as names)")
    inventory = set(_symbols.inventory(text_cfg["frontend"]))
    outside = sorted({c for c in symbols if c not in inventory})
    if outside:
        what = "phoneme(s)" if text_cfg["frontend"] == "phonemes" else "letter(s)"
        return f"{what} {_named(outside)} outside the {text_cfg['frontend']} inventory (pipeline/symbols.py)"
    if says_nothing(symbols):
        return f"gives no {text_cfg['frontend']} (nothing to say)"
    return None


def vocabulary(text_cfg, espeak=None) -> dict:
    """What a model's ids mean: the front end's fixed inventory (pipeline/symbols.py) and the
    settings that make text into it; saved with the caches and with each run, read by synthesis.
    `espeak`: the espeak-ng version the phonemes came from."""
    _pipeline(text_cfg["cleaners"])  # an unknown name fails here
    return {"symbols": _symbols.inventory(text_cfg["frontend"]), "pad_id": PAD_ID, "eos_id": EOS_ID,
            "frontend": text_cfg["frontend"], "language": text_cfg["language"], "cleaners": text_cfg["cleaners"],
            "espeak": espeak if text_cfg["frontend"] == "phonemes" else None}


def encode(text: str, vocab: dict) -> list[int]:
    """Ids of `text` under a saved vocabulary (its front end, voice and cleaners), EOS last.
    TextError naming the characters when the text cannot be spoken (`problem`)."""
    cfg = {k: vocab[k] for k in ("frontend", "language", "cleaners")}
    symbols, _ = to_symbols([text], cfg)[0]
    reason = problem(text, symbols, cfg)
    if reason:
        raise TextError(f"{shown(text)}: {reason}")
    if vocab["frontend"] == "phonemes" and vocab.get("espeak") not in (None, espeak_version()):
        logging.getLogger(__name__).warning("espeak-ng %s phonemizes this text; the model was trained on %s",
                                            espeak_version(), vocab["espeak"])
    return ids_of(symbols, vocab)


def ids_of(symbols: str, vocab: dict) -> list[int]:
    """Ids of a front-end symbol string (e.g. phonemes), EOS last; TextError naming symbols the
    vocabulary lacks."""
    ids = {s: i for i, s in enumerate(vocab["symbols"])}
    unknown = sorted({c for c in symbols if c not in ids})
    if unknown:  # outside the inventory, or a run whose vocabulary is older than this inventory
        raise TextError(f"{symbols!r}: symbol(s) {_named(unknown)} are not in this vocabulary")
    return [ids[c] for c in symbols] + [vocab["eos_id"]]


def decode(ids, vocab) -> str:
    """The symbols of an id sequence, skipping pad and eos."""
    symbols = vocab["symbols"]
    out = []
    for i in map(int, ids):
        if not 0 <= i < len(symbols):
            raise TextError(f"id {i} is outside the vocabulary (0..{len(symbols) - 1})")
        if i not in (vocab["pad_id"], vocab["eos_id"]):
            out.append(symbols[i])
    return "".join(out)


@cli
def main(argv=None):
    parser = argparse.ArgumentParser(description="Show the cleaned text, symbols and ids of a sentence.")
    parser.add_argument("text")
    parser.add_argument("--frontend", default="phonemes", choices=FRONTENDS)
    parser.add_argument("--language", help="espeak-ng voice (default en-us; with --ids: vocab.json's language)")
    parser.add_argument("--cleaners", default="english", choices=sorted(CLEANERS))
    parser.add_argument("--ids", action="store_true",
                        help="print the token ids an exported model takes for the text (a JSON list), with the "
                             "vocabulary and front end of a run's vocab.json (--run, else --config's run)")
    parser.add_argument("--run", help="with --ids: an export folder, or a run folder holding export/vocab.json")
    parser.add_argument("--config", help="with --ids: the config whose run to use (default configs/config.yaml)")
    args = parser.parse_args(argv)
    if args.ids:
        from pipeline.runinfo import ids_vocabulary  # reads the config: only here
        vocab, source = ids_vocabulary(run=args.run, config_path=args.config)
        print(f"ids from {source}" + (f", voice {args.language}" if args.language else ""), file=sys.stderr)
        print(json.dumps(encode(args.text, dict(vocab, language=args.language or vocab["language"]))))
        return
    args.language = args.language or "en-us"
    cfg = dict(frontend=args.frontend, language=args.language, cleaners=args.cleaners)
    symbols, dropped = to_symbols([args.text], cfg)[0]
    reason = problem(args.text, symbols, cfg)
    if reason:
        raise TextError(f"{shown(args.text)}: {reason}")
    print(clean_text(args.text, args.cleaners))
    print(symbols + (f"   ({dropped} characters dropped)" if dropped else ""))
    if args.frontend == "phonemes":
        print(f"espeak-ng {espeak_version()}, voice {args.language}")


if __name__ == "__main__":
    main()
