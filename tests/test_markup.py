"""Markup (pipeline/markup.py): sentences, inline phonemes, each SSML element and each markup error."""
import re
import time

import pytest

from pipeline.markup import PARAGRAPH_PAUSE, MarkupError, Pause, Speech, parse, sentences


def said(text, ssml=None):
    """Each sentence as a list of ("text" | "ph", words, rate, pitch) and ("pause", seconds)."""
    out = []
    for sentence in sentences(parse(text, ssml)):
        out.append([("pause", i.seconds) if isinstance(i, Pause) else
                    ("ph" if i.phonemes else "text", " ".join(i.text.split()), i.rate, i.pitch) for i in sentence])
    return out


def test_plain_text_splits_into_sentences_and_paragraphs():
    text = "Mr. Smith paid $5.50, then left! Did J. R. Doe stay? Yes…\n  \nA new paragraph. Its end"
    assert said(text) == [[("text", "Mr. Smith paid $5.50, then left!", 1.0, 0.0)],
                          [("text", "Did J. R. Doe stay?", 1.0, 0.0)],
                          [("text", "Yes…", 1.0, 0.0)],
                          [("pause", PARAGRAPH_PAUSE), ("text", "A new paragraph.", 1.0, 0.0)],
                          [("text", "Its end", 1.0, 0.0)]]
    assert said("one line\nwrapped. Two") == [[("text", "one line wrapped.", 1.0, 0.0)], [("text", "Two", 1.0, 0.0)]]


@pytest.mark.parametrize("text, want", [
    # "The U.S." and " economy grew." were two sentences: "u.s" is no abbreviation and not one letter
    ("The U.S. economy grew. So did prices.", ["The U.S. economy grew.", "So did prices."]),
    ("Apples, pears, etc. and more. Fine.", ["Apples, pears, etc. and more.", "Fine."]),
    ("Use e.g. this one. Or approx. 5 of them.", ["Use e.g. this one.", "Or approx. 5 of them."]),
    ("Meet at 10 a.m. and the U.K. (see) office.", ["Meet at 10 a.m. and the U.K. (see) office."]),
    ("I live in the U.S. The economy is big.", ["I live in the U.S.", "The economy is big."]),  # a capital after
    ("Mr. Smith met J. Smith. Then Dr. Who.", ["Mr. Smith met J. Smith.", "Then Dr. Who."]),
    ("It ended! then? so… and more.", ["It ended!", "then?", "so…", "and more."]),   # only a lone period
    # after an ordinary word a period ends the sentence whatever follows: text written in lower case,
    # a number, a numbered list
    ("i went home. it was late. we ate.", ["i went home.", "it was late.", "we ate."]),
    ("Born in 1950. 20 years later he left.", ["Born in 1950.", "20 years later he left."]),
    # months, companies, et al.; "No." holds one together only before a number
    ("Born Jan. 5, 1950. Apple Inc. and Google Corp. are big. Smith et al. found it.",
     ["Born Jan. 5, 1950.", "Apple Inc. and Google Corp. are big.", "Smith et al. found it."]),
    ("See No. 5 and pp. 10. I said no. Then he left.", ["See No. 5 and pp. 10.", "I said no.", "Then he left."]),
    # street words the front end reads (avenue, highway, ...): one sentence
    ("Take Hwy. 1 to Fifth Ave. North. Then stop.", ["Take Hwy. 1 to Fifth Ave. North.", "Then stop."]),
])
def test_a_period_after_an_initialism_before_a_lower_case_word_does_not_end_a_sentence(text, want):
    assert [sentence[0][1] for sentence in said(text)] == want


@pytest.mark.parametrize("text, want", [
    # the word after "U.S." / "No." is in the next item: it decides as it would in one text
    ("The U.S. [[ ɪkˈɑnəmi ]] grew. Then it fell.",   # a phoneme span has no case: it continues
     [["The U.S.", "ɪkˈɑnəmi", "grew."], ["Then it fell."]]),
    ('<speak>The U.S. <prosody rate="slow">economy</prosody> grew. Then.</speak>',
     [["The U.S.", "economy", "grew."], ["Then."]]),
    ('<speak>See No. <prosody rate="slow">5</prosody> now. Then.</speak>', [["See No.", "5", "now."], ["Then."]]),
    ('<speak>I live in the U.S. <prosody rate="slow">The economy</prosody> is big.</speak>',
     [["I live in the U.S."], ["The economy", "is big."]]),                  # a capital ends it, as in plain text
    ('<speak>In the U.S.<break time="1s"/> the economy grew.</speak>',
     [["In the U.S.", 1.0, "the economy grew."]]),
    # past a break to the next words; a <s>, <p> or paragraph ends the sentence whatever follows
    ('<speak>In the U.S. <break time="1s"/> "the economy" grew. Then.</speak>',
     [["In the U.S.", 1.0, '"the economy" grew.'], ["Then."]]),
    ('<speak>In the U.S. <break time="1s"/> The economy grew.</speak>', [["In the U.S."], [1.0, "The economy grew."]]),
    ("<speak><s>We left the U.S. </s><s>then we ate.</s><p>the end</p></speak>",
     [["We left the U.S."], ["then we ate."], [PARAGRAPH_PAUSE, "the end"]]),
    ("We left the U.S. \n\nthen we ate.", [["We left the U.S."], [PARAGRAPH_PAUSE, "then we ate."]]),
    # a mark with no space after it, at the end of an item: the next item decides as after a space (these
    # were one sentence each)
    ('<speak>It was late.<break time="1s"/>Then we ate.</speak>', [["It was late."], [1.0, "Then we ate."]]),
    ("It was late![[ ðɛn ]] we ate. Bye.", [["It was late!"], ["ðɛn", "we ate."], ["Bye."]]),
    ('<speak>Mr.<prosody rate="slow">Smith</prosody> came.</speak>', [["Mr.", "Smith", "came."]]),
])
def test_the_word_after_an_initialism_in_the_next_item_decides_whether_the_sentence_ends(text, want):
    assert [[part[1] for part in sentence] for sentence in said(text)] == want


def test_inline_phonemes_are_kept_as_they_are():
    assert said("Say [[ təmˈɑːtoʊ  ]] now. [[ haɪ ]]") == [
        [("text", "Say", 1.0, 0.0), ("ph", "təmˈɑːtoʊ", 1.0, 0.0), ("text", "now.", 1.0, 0.0)],
        [("ph", "haɪ", 1.0, 0.0)]]


@pytest.mark.parametrize("text, message", [
    ("Hello [[ həlˈoʊ", "line 1, column 7: '[[' without a closing ']]'"),
    ("Hello\nthere ]] x", "line 2, column 7: ']]' without an opening '[['"),
    ("a [[ b [[ c ]]", "line 1, column 8: '[[' inside phonemes opened at line 1, column 3"),
    ("x\n\nab [[  ]]", "line 3, column 4: empty phonemes '[[ ]]'"),
])
def test_inline_errors_name_the_position(text, message):
    with pytest.raises(MarkupError, match="^" + re.escape(message)):
        parse(text)


def test_ssml_elements():
    doc = """<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis">
    Hello <break time="250ms"/> there. <break strength="strong"/>
    <prosody rate="150%" pitch="+2st">Quick <prosody rate="slow" pitch="low">and low</prosody></prosody>
    <phoneme alphabet="ipa" ph="təmˈɑːtoʊ">tomato</phoneme> &amp; [[ haɪ ]]
    <p><s>First, one</s><s>second</s></p><break time="1.5s"/><prosody pitch="-10%">down</prosody></speak>"""
    out = said(doc)
    assert out[0] == [("text", "Hello", 1.0, 0.0), ("pause", 0.25), ("text", "there.", 1.0, 0.0)]
    assert out[1][0] == ("pause", 0.7)                                       # strength="strong"
    assert out[1][1:3] == [("text", "Quick", 1.5, 2.0), ("text", "and low", 1.5 * 0.75, 0.0)]  # nested
    assert out[1][3:] == [("ph", "təmˈɑːtoʊ", 1.0, 0.0), ("text", "&", 1.0, 0.0), ("ph", "haɪ", 1.0, 0.0)]
    assert out[2] == [("pause", PARAGRAPH_PAUSE), ("text", "First, one", 1.0, 0.0)]   # <p>, then <s>
    assert out[3] == [("text", "second", 1.0, 0.0)]
    assert out[4][:2] == [("pause", PARAGRAPH_PAUSE), ("pause", 1.5)]        # after </p>: a new paragraph
    assert out[4][2][:2] == ("text", "down") and out[4][2][3] == pytest.approx(-1.824, abs=1e-3)
    assert said("<speak>a</speak>") == said("a", ssml=True) == [[("text", "a", 1.0, 0.0)]]
    assert said("<speak>a</speak>", ssml=False)[0][0][1] == "<speak>a</speak>"  # plain text when told so
    with pytest.raises(MarkupError, match="^line 1, column 3: <b> is not"):
        parse("a <b>c</b>", ssml=True)                                     # the implied root shifts nothing


@pytest.mark.parametrize("doc, message", [
    ("<speak>Hi <b>x</b></speak>", r"line 1, column 11: <b> is not in the supported subset"),
    ("<speak>Hi\n<break time='5 min'/></speak>", r"line 2, column 1: <break time='5 min'>: a time like"),
    ("<speak><break time='11s'/></speak>", r"line 1, column 8: <break time='11s'>: at most 10 s"),
    ("<speak><break strength='huge'/></speak>", r"<break strength='huge'>: one of none"),
    ("<speak><prosody rate='-80%'>x</prosody></speak>", r"<prosody rate='-80%'>: one of x-slow"),
    ("<speak><prosody rate='fastest'>x</prosody></speak>", r"<prosody rate='fastest'>"),
    ("<speak><prosody pitch='200Hz'>x</prosody></speak>", r"<prosody pitch='200Hz'>"),
    ("<speak><prosody volume='loud'>x</prosody></speak>", r"<prosody> takes rate, pitch, not volume"),
    ("<speak><phoneme alphabet='x-sampa' ph='h@'>x</phoneme></speak>", r"only alphabet=\"ipa\""),
    ("<speak><phoneme alphabet='ipa'>x</phoneme></speak>", r"<phoneme> needs a non-empty ph"),
    ("<speak>Hello <s>there</speak>", r"line 1, column 24: invalid SSML: mismatched tag"),
    ("<speak>a &nbsp; b</speak>", r"line 1, column 10: invalid SSML: undefined entity"),
    ("<speak>a</speak><speak>b</speak>", r"invalid SSML: junk after document element"),
    ("<speak><speak>a</speak></speak>", r"<speak> must be the one root element"),
    ("<speak>a [[ b </speak>", r"line 1, column 10: '\[\[' without a closing"),
    ("<speak>    [[ x</speak>", r"line 1, column 12: '\[\[' without a closing"),   # after leading spaces
    ('<speak><p class="x">a</p></speak>', r"line 1, column 8: <p> takes no attributes, not class"),
    ('<speak><s xml:lang="de">a</s></speak>', r"line 1, column 8: <s> takes no attributes, not xml:lang"),
])
def test_ssml_errors_name_the_position(doc, message):
    with pytest.raises(MarkupError, match=f"^{message}" if message.startswith("line") else message):
        parse(doc)


@pytest.mark.parametrize("rate, factor", [
    ("+50%", 1.5), ("-50%", 0.5), (" -20% ", 0.8), ("+0%", 1.0), ("-75%", 0.25), ("+300%", 4.0),   # a change
    ("50%", 0.5), ("150%", 1.5), ("25%", 0.25), ("1.5", 1.5), ("fast", 1.25),                    # a multiple
])
def test_a_signed_rate_is_a_relative_change_as_in_ssml(rate, factor):
    # "+50%" was read as "50%": half the speed, where 1.5 times was asked for; "-50%" was refused
    assert said(f'<prosody rate="{rate}">x</prosody>', ssml=True) == [[("text", "x", factor, 0.0)]]


@pytest.mark.parametrize("rate", ["-80%", "-100%", "+301%", "20%", "401%", "nan", "+-5%"])
def test_a_rate_out_of_range_is_refused(rate):
    with pytest.raises(MarkupError, match="^" + re.escape(f"line 1, column 8: <prosody rate={rate!r}>: one of x-slow, "
                                                          "slow, medium, default, fast, x-fast, 25%..400%, or a change "
                                                          "-75%..+300%") + "$"):
        parse(f'<speak><prosody rate="{rate}">x</prosody></speak>')


@pytest.mark.parametrize("doc, message", [
    # each was said as well as ph: "tomato" a second time, a pause, the inner ph too
    ('<phoneme alphabet="ipa" ph="təmˈɑːtoʊ"><s>tomato</s></phoneme>', "line 1, column 40: <s> inside <phoneme>"),
    ('<phoneme ph="a">\n  x <break/></phoneme>', "line 2, column 5: <break> inside <phoneme>"),
    ('<phoneme ph="a"><phoneme ph="b">x</phoneme></phoneme>', "line 1, column 17: <phoneme> inside <phoneme>"),
    ('<speak><phoneme ph="a"><prosody rate="fast">x</prosody></phoneme></speak>',
     "line 1, column 24: <prosody> inside <phoneme>"),
])
def test_an_element_inside_phoneme_is_refused(doc, message):
    with pytest.raises(MarkupError, match="^" + re.escape(message) + ": a <phoneme> holds only the word its ph says"):
        parse(doc, ssml=True)


def test_a_markup_bomb_is_refused_at_once():
    entities = "".join(f'<!ENTITY e{i} "{f"&e{i - 1};" * 10}">' for i in range(1, 30))
    bomb = f'<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY e0 "ha">{entities}]><speak>&e29;</speak>'
    t0 = time.perf_counter()
    for text in (bomb, bomb.replace('<?xml version="1.0"?>', "")):
        with pytest.raises(MarkupError, match="a DTD .* is not accepted"):
            parse(text)                                        # recognised as SSML by its start
    external = '<!DOCTYPE speak SYSTEM "file:///etc/passwd"><speak>x</speak>'
    with pytest.raises(MarkupError, match="not accepted"):
        parse(external)
    # refused before any expansion: expanded, &e29; is 2 * 10^29 characters (no machine ends that); a loaded
    # CI machine can take far more than the ~1 ms this takes alone, so the bound only tells the two apart
    assert time.perf_counter() - t0 < 5.0


def test_speech_items_carry_their_position():
    items = parse("<speak>\n  <prosody rate='fast'>Hi [[ haɪ ]]</prosody></speak>")
    speech = [i for i in items if isinstance(i, Speech)]
    assert [(i.text.strip(), i.where) for i in speech] == [("Hi", "line 2, column 24"), ("haɪ", "line 2, column 27")]


@pytest.mark.parametrize("text, message", [
    ("Hello there. \0How are you today?", "line 1, column 14: control character U+0000 is not plain text"),
    ("Hi.\n\nOne \x1b[31mred", "line 3, column 5: control character U+001B"),
    ("Hel\u200blo", "line 1, column 4: invisible character U+200B (zero width space) is not plain text"),
    ("<speak>Hi &#x200D;there</speak>", "line 1, column 11: invisible character U+200D (zero width joiner)"),
    ("Say [[ ha\0 ]]", "line 1, column 10: control character U+0000"),
])
def test_a_control_or_invisible_character_is_refused_where_it_is(text, message):
    # espeak-ng stopped at the NUL: "How are you today?" was silently not said (and a zero-width
    # space split "Hello" in two words)
    with pytest.raises(MarkupError, match="^" + re.escape(message)):
        parse(text)


def test_whitespace_soft_hyphens_and_a_leading_byte_order_mark_are_text():
    assert said("\ufeffHel\u00adlo\tthere,\r\nfriend\x0c of mi\u200cne.") == [
        [("text", "Hel\u00adlo there, friend of mi\u200cne.", 1.0, 0.0)]]


@pytest.mark.parametrize("text, message", [
    # was "line 1, column 8: invalid SSML: mismatched tag": a column in the hidden </speak> closing the text
    ("<s>hi", "line 1, column 6: invalid SSML at the end of the text: <s> is not closed"),
    ("a\n<p><s>b</s>\nc", "line 3, column 2: invalid SSML at the end of the text: <p> is not closed"),
    ("hi <b", "line 1, column 6: invalid SSML at the end of the text: not well-formed (invalid token)"),
    ("hi</s>", "line 1, column 5: invalid SSML: mismatched tag"),                # within the text: where it is
])
def test_ssml_without_its_root_names_positions_in_the_text_as_given(text, message):
    with pytest.raises(MarkupError, match="^" + re.escape(message) + "$"):
        parse(text, ssml=True)


def test_break_and_pitch_limits_are_inclusive():
    # MAX_BREAK (10 s) and 12 semitones are the largest values taken, not the first refused
    assert said('<speak>a <break time="10s"/> b</speak>') == [[("text", "a", 1.0, 0.0), ("pause", 10.0),
                                                              ("text", "b", 1.0, 0.0)]]
    for st in ("+12st", "-12st"):
        assert said(f'<speak><prosody pitch="{st}">x</prosody></speak>') == [[("text", "x", 1.0, float(st[:-2]))]]
    with pytest.raises(MarkupError, match=r"<prosody pitch='\+12.5st'>"):
        parse('<speak><prosody pitch="+12.5st">x</prosody></speak>')


def test_the_first_paragraph_starts_without_a_pause():
    assert said("<speak><p>Hi.</p><p>Bye.</p></speak>") == [[("text", "Hi.", 1.0, 0.0)],
                                                          [("pause", PARAGRAPH_PAUSE), ("text", "Bye.", 1.0, 0.0)]]


def test_the_end_of_an_s_ends_its_sentence_whatever_follows():
    assert said("<speak><s>We left the U.S.</s> then we ate.</speak>") == [
        [("text", "We left the U.S.", 1.0, 0.0)], [("text", "then we ate.", 1.0, 0.0)]]


def test_a_period_after_a_single_digit_ends_the_sentence():
    # one letter before a period is an initial ("J. Smith"); one digit is a number ending the sentence
    assert [s[0][1] for s in said("I have 5. Then I left.")] == ["I have 5.", "Then I left."]


def test_a_break_of_no_length_alone_makes_no_sentence():
    # a sentence of nothing but a 0 s pause was sent to the voice (an empty chunk in `speak --raw`)
    assert said('<speak>One. <break strength="none"/></speak>') == [[("text", "One.", 1.0, 0.0)]]


@pytest.mark.parametrize("doc, start", [
    ('<speak><break time="{v}s"/></speak>', "line 1, column 8: <break time='99999999"),
    ('<speak><prosody rate="{v}%">a</prosody></speak>', "line 1, column 8: <prosody rate='9999999"),
    ('<speak><prosody pitch="+{v}st">a</prosody></speak>', "line 1, column 8: <prosody pitch='+999999"),
    ('<speak><break strength="{v}"/></speak>', "line 1, column 8: <break strength='99999"),
    ('<speak><phoneme alphabet="{v}" ph="a">a</phoneme></speak>', "line 1, column 8: <phoneme alphabet='999"),
    ('<speak><t{v}>a</t{v}></speak>', "line 1, column 8: <'t99999"),
    ('<speak><s a{v}="1">a</s></speak>', "line 1, column 8: <s> takes no attributes, not 'a9999"),
])
def test_an_error_quotes_a_long_name_or_value_by_its_start_and_length(doc, start):
    # a 100 kB attribute (the server's body limit) made a 100 kB error line, in its answer and log
    with pytest.raises(MarkupError) as e:
        parse(doc.format(v="9" * 100_000))
    message = str(e.value)
    assert message.startswith(start) and len(message) < 300 and "characters)" in message, message[:300]
