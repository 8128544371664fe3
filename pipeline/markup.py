"""Markup for `speak` and `serve`: plain text with inline phonemes, or a small subset of SSML.

Reads a string; writes nothing. `parse(text, ssml=None)` -> a flat list of `Speech`, `Pause` and
`Boundary` items; `sentences(items)` groups them into sentences (lists of `Speech` and `Pause`), the
unit `speak --raw` and `serve ?stream=true` send one at a time. docs/speak.md documents the subset.

- Plain text: paragraphs are separated by blank lines; `[[ həlˈoʊ ]]` inserts symbols of the
  voice's own set (vocab.json) as they are (spaces inside separate words).
- SSML (ssml=True, or text starting with `<speak`; with ssml=True a text without the `<speak>` root
  is read as if inside one): `<speak>` root, `<p>`, `<s>`,
  `<break time="500ms"/>` / `<break strength="strong"/>`, `<prosody rate="..." pitch="...">`,
  `<phoneme alphabet="ipa" ph="...">word</phoneme>` (text only inside). Parsed by the standard
  library's expat with every DTD refused at its first byte (no entity can be declared, so none can
  be expanded: a "billion laughs" document costs one parser start).

Every error is a MarkupError whose one line starts with the position (line L, column C, 1-based),
among them a control or invisible character in the text (`check_characters`).

    from pipeline import markup
    markup.sentences(markup.parse('<speak>Hi. <break time="1s"/> [[ həlˈoʊ ]]</speak>'))
"""
import bisect
import math
import re
import unicodedata
from dataclasses import dataclass
from xml.parsers import expat

from pipeline.errors import PipelineError

PARAGRAPH_PAUSE = 0.5            # seconds of silence between paragraphs
MAX_BREAK = 10.0                 # seconds: the longest <break> taken
RATES = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.25, "x-fast": 1.75}
PITCHES = {"x-low": -4.0, "low": -2.0, "medium": 0.0, "default": 0.0, "high": 2.0, "x-high": 4.0}
STRENGTHS = {"none": 0.0, "x-weak": 0.1, "weak": 0.25, "medium": 0.4, "strong": 0.7, "x-strong": 1.0}
ELEMENTS = {"speak": None, "p": (), "s": (), "break": ("time", "strength"), "prosody": ("rate", "pitch"),
            "phoneme": ("alphabet", "ph")}   # element -> the attributes it takes (None: any)

# a sentence ends after . ! ? or … (and closing quotes or brackets) followed by whitespace
_SENTENCE_END = re.compile(r"(?<![.!?…])[.!?…]+[\"')\]”’»]*(?=\s)")  # from a run's first mark: linear
# the first character of the next word (after whitespace and any opening quotes or brackets)
_NEXT_WORD = re.compile(r"\s+[\"'(\[“‘«]*(\S)")
_FIRST_WORD = re.compile(r"\s*[\"'(\[“‘«]*(\S)")   # ... and of the next item's text, after a period ending one
_UNCASED = "x"                   # stands in for a phoneme span there: no case, read as a lower-case word
# words after which a period does not end the sentence
_ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "drs", "st", "jr", "sr", "vs", "etc", "e.g", "i.e", "co", "ltd",
                  "gen", "col", "lt", "sgt", "capt", "rev", "hon", "maj", "esq", "ft", "prof", "mt",
                  "approx", "cf", "incl", "dept", "est", "inc", "corp", "bros", "al", "ave", "blvd", "rd", "hwy",
                  "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec"}
# ... and after which it does not before a number ("No. 5", "pp. 5"), but does otherwise ("I said no. Then")
_BEFORE_NUMBERS = {"no", "nos", "vol", "fig", "p", "pp", "ch", "sec", "art", "op"}
_PARAGRAPHS = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_INLINE = re.compile(r"\[\[|\]\]")
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*")
_PERCENT = re.compile(r"\s*([+-]?)(\d+(?:\.\d+)?)\s*%\s*")
_SEMITONES = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)\s*st\s*")
BOM = "\ufeff"                    # a byte-order mark: dropped at the start of a text, refused elsewhere
_READ_THROUGH = ("\u00ad", "\u200c")   # soft hyphen, zero-width non-joiner: espeak-ng reads words through them


def _shown(value, quoted=True, limit=40):
    """A name or value from the markup as an error gives it (quoted: its repr): whole up to `limit`
    characters, else its start and its length (a 100 kB attribute made a 100 kB error line, in the
    server's answer and its log)."""
    if len(value) <= limit:
        return repr(value) if quoted else value
    return f"{value[:limit]!r}... ({len(value):,} characters)"


class MarkupError(PipelineError):
    """Markup that cannot be read; the message starts with its line and column."""


@dataclass(frozen=True)
class Speech:
    """Text to say: plain text for the front end, or (phonemes=True) the voice's symbols as they are."""
    text: str
    phonemes: bool = False
    rate: float = 1.0      # multiplies the pace (> 1 faster)
    pitch: float = 0.0     # semitones added to the pitch shift
    where: str = ""        # "line L, column C" of the text, for errors about it


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Boundary:
    paragraph: bool = False


def is_ssml(text):
    """True for text that starts as an XML document does (`<speak`, `<?xml`, `<!DOCTYPE`)."""
    return text.lstrip().startswith(("<speak", "<?xml", "<!"))


def parse(text, ssml=None):
    """The items of `text`: SSML when ssml is True (or None and the text starts with `<speak`)."""
    text = text.removeprefix(BOM)         # as a file saved with one starts: not part of the text
    if ssml is None:
        ssml = is_ssml(text)
    if ssml and not is_ssml(text):        # SSML elements without the root: the <speak> is implied
        return _Ssml(f"<speak>{text}</speak>", shift=len("<speak>")).items
    return _Ssml(text).items if ssml else _plain(text)


def locator(text, line=1, column=1):
    """where(offset) -> 'line L, column C' of a character of `text`, which starts at (line, column)."""
    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def where(offset):
        n = bisect.bisect_right(starts, offset) - 1
        return f"line {line + n}, column {offset - starts[n] + (column if n == 0 else 1)}"
    return where


def hidden_character(text):
    """The offset of the first character of `text` that is not seen yet changes what is said, or None: a
    control character other than whitespace (espeak-ng stops at a NUL, and the rest of the sentence
    is silently lost) or a format character (a zero-width space, joiner or direction mark splits a
    word in two); the soft hyphen and zero-width non-joiner, which espeak-ng reads through, pass."""
    for offset, c in enumerate(text):
        if (not c.isprintable() and not c.isspace() and c not in _READ_THROUGH
                and unicodedata.category(c) in ("Cc", "Cf")):
            return offset
    return None


def check_characters(text, where):
    """MarkupError at where(offset) for the first hidden_character of `text`."""
    offset = hidden_character(text)
    if offset is not None:
        c = text[offset]
        what = (f"control character U+{ord(c):04X}" if unicodedata.category(c) == "Cc" else
                f"invisible character U+{ord(c):04X} ({unicodedata.name(c, 'format').lower()})")
        raise MarkupError(f"{where(offset)}: {what} is not plain text; remove it (the front end would stop or "
                          "split a word there)")


def _plain(text):
    items, start, where = [], 0, locator(text)
    for match in [*_PARAGRAPHS.finditer(text), None]:
        end = match.start() if match else len(text)
        items += _inline(text[start:end], lambda o, s=start: where(s + o))
        if match:
            items.append(Boundary(paragraph=True))
            start = match.end()
    return items


def _inline(text, where, rate=1.0, pitch=0.0):
    """Speech items of one run of text: `[[ ... ]]` spans become phoneme Speech. where(offset) -> position."""
    check_characters(text, where)
    items, pos, inside = [], 0, None
    for match in _INLINE.finditer(text):
        if match.group() == "[[":
            if inside is not None:
                raise MarkupError(f"{where(match.start())}: '[[' inside phonemes opened at {where(inside)}")
            items.append(Speech(text[pos:match.start()], False, rate, pitch, where(pos)))
            inside = match.start()
        else:
            if inside is None:
                raise MarkupError(f"{where(match.start())}: ']]' without an opening '[['")
            symbols = " ".join(text[inside + 2:match.start()].split())
            if not symbols:
                raise MarkupError(f"{where(inside)}: empty phonemes '[[ ]]'")
            items.append(Speech(symbols, True, rate, pitch, where(inside)))
            inside = None
        pos = match.end()
    if inside is not None:
        raise MarkupError(f"{where(inside)}: '[[' without a closing ']]'")
    items.append(Speech(text[pos:], False, rate, pitch, where(pos)))
    return [item for item in items if item.text.strip()]


class _Ssml:
    """One SSML document -> items (self.items); MarkupError with the position on anything outside the subset."""

    def __init__(self, text, shift=0):
        self.items, self.stack, self.buffer, self.buffer_at, self.shift = [], [], [], None, shift
        self.parser = p = expat.ParserCreate()
        p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        p.StartDoctypeDeclHandler = lambda *a: self._fail("a DTD (<!DOCTYPE>) is not accepted")
        p.EntityDeclHandler = lambda *a: self._fail("entity declarations are not accepted")
        p.ExternalEntityRefHandler = lambda *a: self._fail("external entities are not accepted")
        p.StartElementHandler, p.EndElementHandler = self._start, self._end
        p.CharacterDataHandler = self._text
        try:
            p.Parse(text, True)
        except expat.ExpatError as e:
            raise MarkupError(self._expat_error(text, e)) from None

    def _expat_error(self, doc, e):
        """expat's error as one line at its position in the text as given; an error in the closing tag of
        an implied <speak> (an element left open, a tag cut short) is said at the end of the text."""
        line, offset = e.lineno, e.offset
        if self.shift:
            given = doc[:-len("</speak>")]
            end = (given.count("\n") + 1, len(given) - given.rfind("\n") - 1)
            if (line, offset) >= end:
                opened = [f"<{tag}>" for tag, *_ in self.stack[1:]]
                mismatch = e.code == expat.errors.codes[expat.errors.XML_ERROR_TAG_MISMATCH]
                what = f"{opened[-1]} is not closed" if opened and mismatch else expat.ErrorString(e.code)
                return f"line {end[0]}, column {self._column(*end)}: invalid SSML at the end of the text: {what}"
        return f"line {line}, column {self._column(line, offset)}: invalid SSML: {expat.ErrorString(e.code)}"

    def _column(self, line, offset):
        """1-based column of a 0-based expat offset, in the text as given (before an implied <speak>)."""
        return max(1, offset + 1 - (self.shift if line == 1 else 0))

    def _where(self):
        line = self.parser.CurrentLineNumber
        return f"line {line}, column {self._column(line, self.parser.CurrentColumnNumber)}"

    def _fail(self, message):
        raise MarkupError(f"{self._where()}: {message}")

    def _prosody(self):
        return self.stack[-1][1:] if self.stack else (1.0, 0.0)

    def _flush(self):
        if self.buffer:
            line, column = self.buffer_at
            run = "".join(self.buffer)
            self.items += _inline(run, locator(run, line, column), *self._prosody())
        self.buffer, self.buffer_at = [], None

    def _text(self, data):
        if self.stack and self.stack[-1][0] == "phoneme":
            return                                # the word a <phoneme> spells; its ph is said instead
        if not self.stack:
            self._fail("text outside <speak>")
        if self.buffer_at is None:
            line = self.parser.CurrentLineNumber
            self.buffer_at = (line, self._column(line, self.parser.CurrentColumnNumber))
        self.buffer.append(data)

    def _start(self, tag, attrs):
        if tag not in ELEMENTS:
            self._fail(f"<{_shown(tag, quoted=False)}> is not in the supported subset ({', '.join(f'<{t}>' for t in ELEMENTS)})")
        if (tag == "speak") != (not self.stack):
            self._fail("<speak> must be the one root element" if tag == "speak" else f"<{tag}> outside <speak>")
        if self.stack and self.stack[-1][0] == "phoneme":   # its ph replaces all it holds: a child would be said too
            self._fail(f"<{tag}> inside <phoneme>: a <phoneme> holds only the word its ph says; put <{tag}> outside it")
        allowed = ELEMENTS[tag]
        extra = sorted(a for a in attrs if allowed is not None and a not in allowed)
        if extra:
            self._fail(f"<{tag}> takes {', '.join(allowed) or 'no attributes'}, not {', '.join(_shown(a, quoted=False) for a in extra)}")
        self._flush()
        rate, pitch = self._prosody()
        if tag in ("s", "p"):
            self.items.append(Boundary(paragraph=tag == "p"))
        elif tag == "break":
            self.items.append(Pause(self._break(attrs)))
        elif tag == "prosody":
            rate *= _rate(attrs.get("rate", "default"), self._fail)
            pitch += _pitch(attrs.get("pitch", "default"), self._fail)
        elif tag == "phoneme":
            if attrs.get("alphabet", "ipa") != "ipa":
                self._fail(f"<phoneme alphabet={_shown(attrs['alphabet'])}>: only alphabet=\"ipa\" (the voice's symbols)")
            symbols = " ".join(attrs.get("ph", "").split())
            if not symbols:
                self._fail("<phoneme> needs a non-empty ph attribute")
            self.items.append(Speech(symbols, True, rate, pitch, self._where()))
        self.stack.append((tag, rate, pitch))

    def _end(self, tag):
        self._flush()
        self.stack.pop()
        if tag in ("s", "p"):
            self.items.append(Boundary(paragraph=tag == "p"))

    def _break(self, attrs):
        if "time" in attrs:
            match = _TIME.fullmatch(attrs["time"])
            if not match:
                self._fail(f"<break time={_shown(attrs['time'])}>: a time like \"500ms\" or \"1.5s\"")
            seconds = float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
            if seconds > MAX_BREAK:
                self._fail(f"<break time={_shown(attrs['time'])}>: at most {MAX_BREAK:g} s")
            return seconds
        strength = attrs.get("strength", "medium")
        if strength not in STRENGTHS:
            self._fail(f"<break strength={_shown(strength)}>: one of {', '.join(STRENGTHS)}")
        return STRENGTHS[strength]


def _rate(value, fail):
    """SSML prosody rate -> a pace factor: a name, a percentage of the default ("150%"), a relative
    change ("+50%" 1.5, "-20%" 0.8, signed as pitch's "+10%") or a number ("1.5")."""
    if value in RATES:
        return RATES[value]
    match = _PERCENT.fullmatch(value)
    if match:   # the sign makes it a change: "+50%" was read as "50%", half the speed asked for
        factor = (1.0 if match.group(1) else 0.0) + float(match.group(1) + match.group(2)) / 100
    else:
        try:
            factor = float(value)
        except ValueError:
            factor = math.nan
    if not 0.25 <= factor <= 4.0:  # also NaN
        fail(f"<prosody rate={_shown(value)}>: one of {', '.join(RATES)}, 25%..400%, or a change -75%..+300%")
    return factor


def _pitch(value, fail):
    """SSML prosody pitch -> semitones: a name, "+2st" / "-3st", or a relative "+10%" / "-10%"."""
    if value in PITCHES:
        return PITCHES[value]
    semitones, percent = _SEMITONES.fullmatch(value), _PERCENT.fullmatch(value)
    if semitones:
        shift = float(semitones.group(1))
    elif percent and percent.group(1):
        ratio = 1 + float(percent.group(1) + percent.group(2)) / 100
        shift = 12 * math.log2(ratio) if ratio > 0 else math.nan
    else:
        shift = math.nan
    if not -12.0 <= shift <= 12.0:
        fail(f"<prosody pitch={_shown(value)}>: one of {', '.join(PITCHES)}, \"+2st\" / \"-3st\", or \"+10%\" "
             "(within 12 semitones)")
    return shift


def _ends(text, following=None):
    """Offsets in `text` where a sentence ends (after its punctuation). A lone period does not end one
    after an abbreviation or an initial ("Mr. Smith", "J. Smith", "approx. 5"), nor after a dotted
    initialism before a lower-case word ("U.S. economy", "a.m. and"); before a capital it does ("in
    the U.S. The economy"), and after any other word whatever follows ("it was late. we ate.").

    `following` is the text of the next item when the words after `text` are in another one (None: no
    more words before a <s>, <p> or paragraph, which ends the sentence anyway): a period whose next word
    is not in `text` is decided by that text's first word as it would be inside one text. A phoneme
    span has no case: sentences() passes _UNCASED for it, a lower-case word, so it continues a
    sentence after a dotted initialism ("the U.S. [[ ɪkˈɑnəmi ]] grew") but, not being a digit, not
    after "No." and its like. Before another item a mark at the very end of `text` counts too ("late."
    then <break/> then "Then"), as if a space followed it."""
    out = []
    for match in _SENTENCE_END.finditer(text if following is None else text + " "):
        if match.group() != "." or not _period_continues(text, match, following):
            out.append(match.end())
    return out


def _period_continues(text, match, following):
    """Whether the lone period `match` in `text` is within a sentence (see _ends)."""
    begin = match.start()
    while begin > 0 and not text[begin - 1].isspace():   # back to the start of the word (not a regex
        begin -= 1                                         # over the whole text before: that is quadratic)
    head = text[begin:match.start()].lower().lstrip("\"'([“‘«")
    if head in _ABBREVIATIONS or (len(head) == 1 and head.isalpha()):
        return True                                          # "Mr. Smith", "J. Smith", "approx. 5"
    if "." not in head and head not in _BEFORE_NUMBERS:
        return False
    # None only when nothing but whitespace is left in `text` (the period is followed by some): at most once
    after = _NEXT_WORD.match(text, match.end()) or (following and _FIRST_WORD.match(following))
    return bool(after) and (after.group(1).isdigit() if head in _BEFORE_NUMBERS
                            else after.group(1).islower())   # "U.S. economy", "a.m. and", "No. 5"


def _lookahead(items):
    """For each item, the `following` of _ends: the text of the next Speech item past any Pause
    (_UNCASED for a phoneme span), or None before a Boundary or at the end."""
    out, following = [None] * len(items), None
    for n in range(len(items) - 1, -1, -1):
        out[n], item = following, items[n]
        if isinstance(item, Boundary):
            following = None
        elif isinstance(item, Speech) and item.text.strip():
            following = _UNCASED if item.phonemes else item.text
    return out


def sentences(items):
    """Group items into sentences (lists of Speech and Pause): plain text splits after . ! ? …,
    <s> and <p> and paragraphs end one; a paragraph's first sentence starts with PARAGRAPH_PAUSE."""
    items = list(items)
    out, current, paragraph = [], [], False

    def flush():
        nonlocal current, paragraph
        if any(isinstance(i, Speech) for i in current) or any(i.seconds > 0 for i in current):
            if paragraph and out:
                current.insert(0, Pause(PARAGRAPH_PAUSE))
            out.append(current)
            paragraph = False
        current = []

    for item, following in zip(items, _lookahead(items)):
        if isinstance(item, Boundary):
            flush()
            paragraph = paragraph or item.paragraph
        elif isinstance(item, Speech) and not item.phonemes:
            start = 0
            for end in _ends(item.text, following):
                current.append(Speech(item.text[start:end], False, item.rate, item.pitch, item.where))
                flush()
                start = end
            if item.text[start:].strip():
                current.append(Speech(item.text[start:], False, item.rate, item.pitch, item.where))
        else:
            current.append(item)
    flush()
    return [[i for i in s if not isinstance(i, Speech) or i.text.strip()] for s in out]
