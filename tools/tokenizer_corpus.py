"""Deterministic corpus of test strings for the tokenizer golden file.

corpus() -> list of (category, text); texts() -> list of text. Every text is valid Unicode that
encodes to UTF-8 (no lone surrogates). Nothing here depends on the Python version or on any
package: the pseudo-random part uses its own 64-bit LCG.

    python3 tools/tokenizer_corpus.py      # prints counts per category
"""

_NBSP, _EMSP, _IDSP = "\u00a0", "\u2003", "\u3000"
_ZWSP, _ZWNJ, _ZWJ, _WJ, _BOM, _SHY = "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"
_LRM, _RLM = "\u200e", "\u200f"


def _english():
    return [
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog.",
        "What is 2 + 2?",
        "You are ChatGPT, a large language model trained by OpenAI.",
        "Knowledge cutoff: 2024-06\n\nReasoning: medium",
        "In 1492, Columbus sailed the ocean blue.",
        "She said, \"It's fine\" -- and left.",
        "e.g. i.e. etc. Mr. Mrs. Dr. St. vs.",
        "A sentence with trailing spaces.   ",
        "   A sentence with leading spaces.",
        "Multiple     spaces    between     words.",
        "UPPERCASE SENTENCE WITH NUMBERS 123 AND SYMBOLS #@!",
        "lowercase sentence without punctuation",
        "Title Case Is Used In Headlines",
        "camelCaseIdentifier PascalCaseIdentifier snake_case_identifier kebab-case-identifier",
        "HTTPServer XMLHttpRequest getHTTPResponseCode IOError URLParser",
        "iPhone eBay McDonald's O'Neill MacArthur",
        "tl;dr: it works (mostly).",
        "Q: Why?\nA: Because.",
        "Ask not what your country can do for you; ask what you can do for your country.",
    ]


def _contractions():
    out = []
    for w in ["I'm", "I'M", "i'm", "DON'T", "don't", "Don'T", "they'Ve", "THEY'VE", "they've", "we'll",
              "WE'LL", "We'Ll", "you'd", "YOU'D", "she's", "SHE'S", "it'S", "can't", "CAN'T", "won't",
              "y'all", "o'clock", "rock'n'roll", "1990's", "the '90s", "'tis", "'s", "'S", " 's", "x's",
              "don\u2019t", "it\u2019s", "I\u2019M", "l'homme", "dell'anno", "aujourd'hui"]:
        out.append(w)
    out.append("I'm sure they'll say we'd've done it if we'd known, but DON'T you think it's odd?")
    out.append("'quoted' \"double\" 'mixed\" 'unbalanced")
    return out


def _latin():
    return [
        "Ça va très bien, merci. Où est la bibliothèque ? L'été dernier, nous sommes allés à Noël.",
        "Größe, Maß, Straße, Fußgängerübergänge, Äpfel, Öl, Übermut.",
        "¿Dónde está el niño? ¡Qué mañana tan bonita! Año, pingüino, acción.",
        "Coração, informação, pão, não, avó, avô, àquele.",
        "Zażółć gęślą jaźń. Łódź, Kraków, Gdańsk.",
        "Příliš žluťoučký kůň úpěl ďábelské ódy.",
        "Tiếng Việt có nhiều dấu: Nguyễn, Trường, Đà Nẵng, phở, bánh mì.",
        "İstanbul'da ılık bir gün. IĞDIR, ığdır, ŞEKER, şeker, Ümit, öğretmen.",
        "Þetta er íslenska: ðæ, Þórr, Ævar, fjörður.",
        "Dansk og norsk: blåbærsyltetøy, Ærø, Øresund, Ålborg.",
        "Română: știință, țară, învățământ.",
        "Magyar: árvíztűrő tükörfúrógép, ŐŰ.",
        "Latin ligatures: ﬁ ﬂ ﬀ ﬃ ﬄ Œuvre œuvre Æsir æther",
        "Esperanto: ĉiuĵaŭde ŝanĝo ĥoro ĝardeno.",
        "Titlecase digraphs: ǅemal ǈubljana ǋ Ǆ ǆ",
        "Modifier letters: ʰ ʲ ʷ ˀ ˤ and IPA: ʃ ʒ θ ð ŋ ɲ ɾ ʔ",
    ]


def _other_scripts():
    return [
        "Привет, мир! Как дела? Съешь же ещё этих мягких французских булок.",
        "Україна, Київ, їжак, ґанок, єдність.",
        "Српски: Љубав, Његош, Ђорђе, Ћирилица, Џеп.",
        "ПРОПИСНЫЕ БУКВЫ И строчные буквы ВмЕсТе.",
        "Ελληνικά: Καλημέρα κόσμε, ΣΊΣΥΦΟΣ σίσυφος, ς σ Σ, ΐ ΰ.",
        "Հայերեն՝ Բարեւ աշխարհ։",
        "ქართული: გამარჯობა მსოფლიო",
        "مرحبا بالعالم! كيف حالك؟ العربية لغة جميلة.",
        "اللُّغَةُ العَرَبِيَّةُ مع التشكيل",
        "فارسی: سلام دنیا، حال شما چطور است؟",
        "اردو: ہیلو دنیا",
        "שלום עולם! מה שלומך?",
        "עִבְרִית עם ניקוד: בְּרֵאשִׁית בָּרָא",
        "नमस्ते दुनिया! आप कैसे हैं? हिन्दी भाषा।",
        "मराठी: महाराष्ट्र, क्षत्रिय, ज्ञान, श्री",
        "বাংলা: আমি তোমাকে ভালোবাসি।",
        "தமிழ்: வணக்கம் உலகம்",
        "తెలుగు: నమస్కారం",
        "ภาษาไทย: สวัสดีชาวโลก ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
        "ພາສາລາວ: ສະບາຍດີ",
        "ភាសាខ្មែរ: សួស្តី",
        "မြန်မာ: မင်္ဂလာပါ",
        "བོད་ཡིག: བཀྲ་ཤིས་བདེ་ལེགས།",
        "አማርኛ: ሰላም ለዓለም",
        "ᚠᚢᚦᚨᚱᚲ runes and 𐌰𐌱𐌲 gothic",
    ]


def _cjk():
    return [
        "你好，世界！今天天气很好。",
        "中文简体与繁體中文混合：学习、學習。",
        "「引用」『二重引用』（括弧）【強調】《書名》",
        "日本語のテキスト：こんにちは、世界。カタカナとひらがなと漢字。",
        "ｶﾀｶﾅ ﾊﾝｶｸ half-width katakana ｱｲｳｴｵ",
        "東京タワーは333メートルです。",
        "ラーメン・ソーメン・ちゃんぽん〜！",
        "한국어: 안녕하세요, 세계! 대한민국 서울특별시.",
        "Decomposed Hangul jamo: \u1112\u1161\u11ab\u1100\u1173\u11af",
        "CJK extension B: \U00020000\U0002a6d6 and 𠮷野家",
        "漢字仮名交じり文、句読点。全角！？",
        "中文数字一二三四五六七八九十百千万亿",
    ]


def _code():
    return [
        "def foo(x: int) -> int:\n    return x * 2\n",
        "import numpy as np\nprint(np.arange(10).reshape(2, 5))\n",
        "#include <cstdio>\nint main() {\n    std::printf(\"%d\\n\", 42);\n    return 0;\n}\n",
        "template <typename T> constexpr T max(T a, T b) noexcept { return a > b ? a : b; }",
        "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
        "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
        "const f = async (a, b) => { await g(a ?? b); return a?.c?.[0] || `x${b}`; };",
        "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
        "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do echo \"$f\"; done 2>&1 | tee log\n",
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"></head><body><p class=\"x\">Hi &amp; bye</p></body></html>",
        ".btn:hover > span::before { content: \"\\201C\"; margin: 0 auto !important; }",
        "key: value\nlist:\n  - a\n  - b: [1, 2, 3]\nnested:\n    deep: true\n",
        "all: build\n\tgcc -O2 -Wall -o app main.c\n\n.PHONY: clean\nclean:\n\trm -f app\n",
        "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a = 1\n+a = 2\n",
        "\\begin{equation}\n  E = mc^2 \\quad \\int_0^\\infty e^{-x^2}\\,dx = \\frac{\\sqrt{\\pi}}{2}\n\\end{equation}",
        "regex: ^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@(?:[a-z0-9-]+\\.)+[a-z]{2,}$",
        "x = [i**2 for i in range(10) if i % 2 == 0]  # comment with Ünïcödé",
        "if (a != b && c <= d || !e) { x += 1; y -= 2; z *= 3; w /= 4; v %= 5; u <<= 1; t >>= 2; }",
        "public static void main(String[] args) { System.out.println(\"Hello\"); }",
        "    indented with four spaces\n\tindented with a tab\n  \t mixed indentation\n",
        "console.log('a'); // trailing comment   \r\nconsole.log('b');\r\n",
        "{\"key\": \"value\", \"n\": 1.5e-3, \"arr\": [true, false, null], \"nested\": {\"a\": {}}}",
        "<|im_start|>system\nYou are helpful.<|im_end|>",
        "\"\"\"docstring\"\"\" '''another''' r'\\d+' b'\\x00\\xff' f'{x!r:>10}'",
    ]


def _numbers():
    out = []
    digits = "31415926535897932384626433832795028841971"
    for n in range(1, 41):
        out.append(digits[:n])
    out += [
        "0", "00", "000", "0000", "007", "1,234", "1,234,567", "1,234,567,890.12", "1.234.567,89",
        "1 234 567", "1\u202f234\u202f567", "3.14159", "-0.001", "+42", "1e-10", "6.022e23", "0x1F", "0xDEADBEEF",
        "0b101010", "0o755", "2024-06-01", "2024-06-01T12:34:56Z", "12:34:56", "+1 (555) 123-4567",
        "192.168.0.1", "v1.2.3-rc.4", "$1,000,000.00", "€12,50", "100%", "50/50", "3/4", "1st 2nd 3rd 4th",
        "١٢٣٤٥٦٧٨٩٠", "۱۲۳۴۵", "१२३४५६", "১২৩", "๑๒๓", "①②③④⑤", "１２３４５", "x² + y³ = z⁴", "½ ¼ ¾ ⅓",
        "Ⅻ Ⅳ ⅸ", "12345678901234567890 and 98765", "a1b2c3d4e5", "abc123def456ghi7890",
        "9" * 30, "10" * 20, "3.1415926535 8979323846 2643383279",
    ]
    return out


def _whitespace():
    out = []
    for n in (1, 2, 3, 4, 7, 8, 15, 16, 31):
        out.append(" " * n)
    out += ["\t", "\t\t", "\t\t\t\t", " \t", "\t ", " \t \t ", "  \t\t  ", "a\tb", "a \tb", "a\t b",
            "\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", "\r", "\r\r", "a\rb", "a\r\nb", "a\n\rb",
            "line1\r\nline2\r\nline3", "line1\nline2\n", "\n a", " \n ", "  \n  ", "\t\n", "\n\t", "\n \n",
            "abc   ", "   abc", "abc   \n", "abc \n def", "a  b   c    d", "word \t\n\r\n  word",
            "\u000b", "\u000c", "a\u000bb\u000cc", "\u0085", "a\u0085b", "\u2028", "a\u2028b\u2029c",
            "trailing tab\t", "trailing newline\n", "trailing CRLF\r\n", "trailing CR\r",
            " \r\n \r\n ", "\n\n\n\n\n\n\n\n\n\n", "x\n\n\n\ny"]
    return out


def _unicode_spaces_and_invisibles():
    return [
        "non" + _NBSP + "breaking" + _NBSP + "space",
        _NBSP, _NBSP * 3, _EMSP, _IDSP, "全角" + _IDSP + "スペース",
        "thin\u2009space narrow\u202fnbsp medium\u205fmath ogham\u1680space en\u2002quad",
        "a" + _NBSP + " " + _NBSP + "b",
        "word" + _EMSP + _EMSP + "word",
        _ZWSP, "zero" + _ZWSP + "width" + _ZWSP + "space",
        "zwnj: می" + _ZWNJ + "خواهم", "zwj" + _ZWJ + "joiner", "word" + _WJ + "joiner",
        _BOM + "BOM at start", "soft" + _SHY + "hyphen",
        _LRM + "left-to-right mark", "right-to-left mark" + _RLM,
        "\u202bembedded RTL\u202c and \u202eoverride\u202c and \u2067isolate\u2069",
        "English " + _RLM + "עברית" + _LRM + " English",
        "tag chars: \U000e0041\U000e0042",
        "variation selectors: \u2764\ufe0e \u2764\ufe0f \u8fbb\U000e0100",
        "private use: \ue000\uf8ff\U000f0000",
        "noncharacters: \ufdd0 \uffff \U0010fffe",
        "replacement char: \ufffd and object \ufffc",
        "control chars: \x00 \x01 \x07 \x1b[31mred\x1b[0m \x7f",
    ]


def _emoji():
    return [
        "😀", "😀😃😄", "Hello 👋 world 🌍!", "👍🏽 👍🏿 👋🏻",
        "👨\u200d👩\u200d👧\u200d👦 family", "🏳️\u200d🌈 🏴\u200d☠️", "👩\u200d💻👨\u200d🔬",
        "🇺🇸🇯🇵🇩🇪🇫🇷 flags", "🇺🇸", "🇦", "1️⃣ #️⃣ *️⃣", "❤️ ❤ ♥", "🫠🫡🫶 new emoji",
        "🏴\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f Scotland-like tag sequence",
        "emoji🙂inside🙃words", "🤦🏼\u200d♂️", ":-) :D <3 ¯\\_(ツ)_/¯ (╯°□°)╯︵ ┻━┻",
    ]


def _combining():
    return [
        "e\u0301", "cafe\u0301 vs caf\u00e9", "a\u0308\u0304", "n\u0303", "\u0301", "\u0301\u0302\u0303",
        "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e"
        "\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311"
        "\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O\u0342\u030c\u030c\u0358\u0328"
        "\u0335\u0339\u033b\u031d\u0333",
        "ḁ̶̧ ṩ̣", "q\u0307\u0323", "1\u20e3", "a\u20dd", "Devanagari with virama: क्ष त्र ज्ञ",
        "Thai with marks: ที่ นี่ ก็",
    ]


def _special_looking():
    return [
        "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>",
        "<|startoftext|>", "<|endoftext|>", "<|endofprompt|>", "<|reserved_200000|>", "<|reserved_200010|>",
        "<|reserved_200017|>", "<|reserved_201087|>", "<|notatoken|>", "< |start| >", "<<|end|>>", "<|", "|>",
        "<|start|>user<|message|>What is 2 + 2?<|end|><|start|>assistant",
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
        "2024-06\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included "
        "for every message.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>analysis"
        "<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello!<|return|>",
        "text before<|endoftext|>text after", "<|endoftext|><|endoftext|>", " <|end|> ", "x<|call|>y",
        "<|START|>", "<|end |>", "<|end|",
    ]


def _short():
    return ["", "a", "Z", " ", "\n", "!", "?", ".", ",", "'", "\"", "é", "ß", "中", "あ", "한", "😀", "0", "7",
            "\t", "\u200b", "-", "_", "~", "\\", "/", "@", "#", "$", "%", "^", "&", "*", "(", ")", "[", "]",
            "{", "}", "<", ">", "|", "`", "+", "=", ";", ":"]


def _long_words():
    return [
        "pneumonoultramicroscopicsilicovolcanoconiosis",
        "Donaudampfschifffahrtsgesellschaftskapitän",
        "supercalifragilisticexpialidocious" * 3,
        "Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch",
        "antidisestablishmentarianism Antidisestablishmentarianism ANTIDISESTABLISHMENTARIANISM",
        "thisIsAVeryLongCamelCaseIdentifierThatKeepsGoingAndGoingAndGoingForeverAndEver",
        "this_is_a_very_long_snake_case_identifier_that_keeps_going_and_going_and_going",
        "SGVsbG8sIHdvcmxkISBUaGlzIGlzIGEgYmFzZTY0IGJsb2IgdGhhdCBpcyBxdWl0ZSBsb25nLg==",
        "0123456789abcdef" * 8,
        "550e8400-e29b-41d4-a716-446655440000 123e4567-e89b-12d3-a456-426614174000",
        "Rindfleischetikettierungsüberwachungsaufgabenübertragungsgesetz",
        "ไม่มีการเว้นวรรคระหว่างคำในภาษาไทยเลยแม้แต่น้อยและประโยคนี้ยาวมาก",
        "日本国憲法第九条戦争放棄軍備及交戦権否認",
    ]


def _web_and_markup():
    return [
        "https://www.example.com/path/to/page?query=1&lang=en#section-2",
        "http://user:pass@localhost:8080/a%20b/c.html",
        "ftp://ftp.example.org/pub/file.tar.gz mailto:someone@example.com",
        "Contact: john.doe+tag@sub.example.co.uk or @handle #hashtag",
        "C:\\Users\\Admin\\Documents\\file name (1).txt",
        "/usr/local/lib/python3.12/site-packages/transformers/__init__.py",
        "../../relative/path/./file",
        "# Heading 1\n## Heading 2\n\n- item 1\n- item 2\n  - nested\n\n1. first\n2. second\n",
        "| col1 | col2 |\n|------|------|\n| a    | b    |\n",
        "```python\nprint('hi')\n```\n",
        "**bold** _italic_ `code` [link](http://x.y) ![img](a.png) > quote ~~strike~~",
        "<a href=\"https://example.com\">link</a> &nbsp; &lt;tag&gt; &#x1F600;",
        "[{\"id\":1,\"tags\":[\"a\",\"b\"]},{\"id\":2,\"tags\":[]}]",
        "{\n  \"name\": \"gpt-oss\",\n  \"layers\": 24,\n  \"experts\": [32, 4]\n}",
        "name,age,city\n\"Smith, J\",42,\"New York\"\nDoe,7,Paris\n",
        "<?xml version=\"1.0\"?><root attr='v'><child/></root>",
    ]


def _mixed_script():
    return [
        "Hello世界", "abcабвαβγ", "日本語English混在テキスト", "Ωmega and αlpha", "naïve café résumé",
        "東京Tokyo2024年", "مرحبا hello שלום", "Русский English 中文 日本語 한국어 العربية हिन्दी",
        "x² + y² = z²; ∀x∈ℝ: x²≥0", "k8s i18n l10n a11y", "A1B2-C3_D4.E5", "ⓐⓑⓒ 🅰🅱 𝐀𝐁𝐂 𝔸𝔹ℂ 𝒜ℬ",
        "ｆｕｌｌｗｉｄｔｈ ＡＢＣ", "Ǆemal's ǅ café",
    ]


def _punctuation():
    return [
        "“smart quotes” and ‘single quotes’", "«guillemets» ‹single›", "„German“ ‚quotes‘",
        "em—dash en–dash hyphen-minus figure‒dash horizontal―bar", "ellipsis… and three dots...",
        "¿Qué? ¡Sí!", "‰ ‱ § ¶ † ‡ • · ※ ⁂", "〜 「」 『』 〈〉 《》 【】 〔〕", "！？。、・：；",
        "⸮ ‽ ⁇ ⁈ ⁉", "∑ ∫ √ ∞ ≠ ≤ ≥ ≈ ± × ÷ ∂ ∇ ∈ ∉ ⊂ ⊃ ∪ ∩", "→ ⇒ ↔ ⇔ ↑ ↓ ⟶ ⟹",
        "┌─┬─┐\n│a│b│\n└─┴─┘", "⠃⠗⠁⠊⠇⠇⠑", "$ € £ ¥ ₹ ₿ ₽ ₩ ¢", "©®™℠", "°C °F ℃ ℉ µm Å Ω",
        "!!!\n\n", "...//", " ///\n", "?!?!?!", "---", "___", "***", "=>", "->", "::", "<=>", "!==",
        "a,b;c:d.e!f?g", "(parenthetical)[bracketed]{braced}<angled>",
    ]


def _repeated():
    return [
        "a" * 1000, " " * 500, "!" * 100, "ab" * 300, "\n" * 50, "0" * 100, "😀" * 50, "ー" * 30,
        "=" * 80, "-" * 80, "\t" * 20, ".." * 50, "中" * 64, "é" * 100, "A" * 200, " a" * 200,
        "\r\n" * 40, "ﷺ" * 5, "abc " * 100,
    ]


class _Lcg:
    def __init__(self, seed):
        self.s = seed & 0xFFFFFFFFFFFFFFFF

    def below(self, n):
        self.s = (self.s * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return (self.s >> 33) % n


_POOLS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " ", "  \t", "\n", "\r\n",
    ".,;:!?'\"-()[]{}<>/\\|@#$%^&*_+=~`", "àéîõüçñßøåæœ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюя",
    "αβγδεζηθικλμνξοπρστυφχψω", "的一是不了人我在有他这中大来上国个到说们", "あいうえおかきくけこアイウエオカキクケコ",
    "가나다라마바사아자차카타파하", "مرحباالعربية", "שלוםעברית", "नमस्तेहिन्दी", "สวัสดีภาษาไทย",
    "😀🙂👍🏽🇺🇸❤️✨🔥", "\u0301\u0308\u0327", "\u00a0\u2003\u3000\u200b", "'s't're've'm'll'd", "²³½①Ⅻ",
]


def _generated(n=80, seed=0x9E3779B97F4A7C15):
    r = _Lcg(seed)
    out = []
    for _ in range(n):
        length = 1 + r.below(40)
        parts = []
        for _ in range(length):
            pool = _POOLS[r.below(len(_POOLS))]
            run = 1 + r.below(4)
            parts.append("".join(pool[r.below(len(pool))] for _ in range(run)))
        out.append("".join(parts))
    return out


def corpus():
    groups = [
        ("english", _english()), ("contractions", _contractions()), ("latin", _latin()),
        ("scripts", _other_scripts()), ("cjk", _cjk()), ("code", _code()), ("numbers", _numbers()),
        ("whitespace", _whitespace()), ("unicode_spaces", _unicode_spaces_and_invisibles()),
        ("emoji", _emoji()), ("combining", _combining()), ("special_looking", _special_looking()),
        ("short", _short()), ("long_words", _long_words()), ("web_markup", _web_and_markup()),
        ("mixed_script", _mixed_script()), ("punctuation", _punctuation()), ("repeated", _repeated()),
        ("generated", _generated()),
    ]
    seen, out = set(), []
    for cat, items in groups:
        for t in items:
            assert isinstance(t, str)
            t.encode("utf-8")  # raises on lone surrogates
            if t in seen:
                continue
            seen.add(t)
            out.append((cat, t))
    return out


def texts():
    return [t for _, t in corpus()]


if __name__ == "__main__":
    import collections
    c = corpus()
    counts = collections.Counter(cat for cat, _ in c)
    for k, v in counts.items():
        print(f"{k:16s} {v}")
    print("total", len(c), "strings,", sum(len(t.encode('utf-8')) for _, t in c), "UTF-8 bytes")
