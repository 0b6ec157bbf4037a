"""The word lists the semantic cache's guards read: what a word means for a guard.

Every table maps a normalized token (see `runtime.cache.ai.guards.normalize`) to
what the guard compares, so two wordings of one meaning compare equal ("turn on"
and "enable", "kg" and "kilograms", "a dozen" and "12") and two meanings do not.
Data only; the parsing is in `runtime.cache.ai.features`.
"""

from __future__ import annotations

# Negation: a prompt's count of these, compared by parity ("doesn't" and "will not").
NEGATIONS = frozenset({
    "not", "never", "cannot", "none", "nobody", "nothing", "nowhere", "neither", "nor",
    "n't",
})

# Words on an axis with a sign. Two prompts on one axis with opposite signs differ
# ("enable" vs "disable"); a prompt with both signs, or one side alone, does not veto.
# Category "negation": polarity and antonym verbs; "comparative": degree words.
_POLARITY: dict[str, tuple[str, ...]] = {
    "on+": ("enable", "activate", "turn on", "switch on", "power on", "start"),
    "on-": ("disable", "deactivate", "turn off", "switch off", "power off", "stop"),
    "inc+": ("increase", "raise", "boost", "grow", "gain", "zoom in", "enlarge"),
    "inc-": ("decrease", "reduce", "shrink", "lose", "zoom out", "cut"),
    "trade+": ("buy", "purchase", "acquire"),
    "trade-": ("sell",),
    "add+": ("add", "insert", "attach", "join"),
    "add-": ("remove", "delete", "detach", "leave", "drop"),
    "install+": ("install",),
    "install-": ("uninstall",),
    "lock+": ("lock",),
    "lock-": ("unlock",),
    "sub+": ("subscribe", "follow", "sign up", "opt in"),
    "sub-": ("unsubscribe", "unfollow", "opt out"),
    "mute+": ("mute",),
    "mute-": ("unmute",),
    "conn+": ("connect", "log in", "sign in", "login"),
    "conn-": ("disconnect", "log out", "sign out", "logout"),
    "crypt+": ("encrypt",),
    "crypt-": ("decrypt",),
    "io+": ("import", "upload"),
    "io-": ("export", "download"),
    "accept+": ("accept", "approve", "confirm"),
    "accept-": ("decline", "reject", "refuse", "deny"),
    "allow+": ("allow", "permit", "unblock", "whitelist"),
    "allow-": ("block", "forbid", "ban", "blacklist"),
    "show+": ("show", "unhide", "reveal", "display"),
    "show-": ("hide", "conceal"),
    "good+": ("good", "healthy", "beneficial", "safe"),
    "good-": ("bad", "harmful", "unhealthy", "unsafe", "dangerous"),
    "pro+": ("pro", "pros", "advantage", "advantages", "benefit", "benefits", "upside",
             "upsides"),
    "pro-": ("con", "cons", "disadvantage", "disadvantages", "drawback", "drawbacks",
             "downside", "downsides", "risk", "risks"),
    "eat+": ("eat", "take", "use", "include"),
    "eat-": ("avoid", "skip"),
    "rise+": ("rise", "go up", "went up", "goes up", "climb"),
    "rise-": ("sink", "fall", "go down", "went down", "goes down", "drop", "collapse"),
    "win+": ("win", "pass", "succeed"),
    "win-": ("fail",),
    "open+": ("open",),
    "open-": ("close", "closed", "shut"),
    # "right" is also "correct" ("the right way to turn left" holds both signs: no veto)
    "side+": ("left", "leftward", "counterclockwise", "anticlockwise"),
    "side-": ("right", "rightward", "clockwise"),
}
_COMPARATIVE: dict[str, tuple[str, ...]] = {
    "price+": ("expensive", "pricey", "pricier", "priciest", "costly"),
    "price-": ("cheap", "cheaper", "cheapest", "inexpensive", "affordable"),
    "speed+": ("fast", "faster", "fastest", "quick", "quicker", "quickest", "quickly",
               "rapid", "rapidly", "speedy"),
    "speed-": ("slow", "slower", "slowest", "slowly"),
    "size+": ("big", "bigger", "biggest", "large", "larger", "largest", "huge", "tall",
              "taller", "tallest"),
    "size-": ("small", "smaller", "smallest", "little", "tiny", "short", "shorter",
              "shortest"),
    "length+": ("long", "longer", "longest"),
    "length-": ("short", "shorter", "shortest"),
    "level+": ("high", "higher", "highest", "above", "over", "more", "most", "max",
               "maximum", "greater", "greatest", "up"),
    "level-": ("low", "lower", "lowest", "below", "under", "less", "least", "fewer",
               "fewest", "min", "minimum", "down"),
    "quality+": ("good", "better", "best", "great", "excellent"),
    "quality-": ("bad", "worse", "worst", "poor", "terrible"),
    "temp+": ("warm", "warmer", "warmest", "hot", "hotter", "hottest"),
    "temp-": ("cold", "colder", "coldest", "cool", "cooler", "coolest", "chilly"),
    "weight+": ("heavy", "heavier", "heaviest"),
    "weight-": ("light", "lighter", "lightest"),
    "age+": ("new", "newer", "newest", "latest", "recent", "modern"),
    "age-": ("old", "older", "oldest"),
    "time+": ("late", "later", "latest"),
    "time-": ("early", "earlier", "earliest"),
    "strength+": ("strong", "stronger", "strongest"),
    "strength-": ("weak", "weaker", "weakest", "mild", "milder", "mildest"),
    "order+": ("after", "following", "afterwards"),
    "order-": ("before", "prior"),
}
# "more X" / "most X" take X's axis and sign; "less X" / "least X" flip it.
DEGREE = {"more": 1, "most": 1, "less": -1, "least": -1}

# Words that relate the words before them to those after, one way round: "Rust is
# faster than Go", "Germany beat Brazil", "convert Celsius to Fahrenheit" say
# something else with the two sides swapped. Canonical name per spelling. "vs" is
# not always one way ("list vs tuple difference"), but often is ("advantages of X
# vs Y", "Arsenal vs Chelsea": the home side): a swap is refused, at worst a miss.
RELATIONS = {
    "than": "than", "vs": "vs", "versus": "vs", "against": "vs",
    "beat": "beat", "beats": "beat", "beaten": "beat", "defeat": "beat",
    "defeats": "beat", "defeated": "beat", "to": "to", "into": "to",
    "before": "before", "after": "after",
}
# Passed over among the words a relation word relates ("is Rust much faster than
# Go", "Germany didn't beat Brazil", "does Messi have more goals than"): articles,
# auxiliaries, degree words.
RELATION_FILLERS = frozenset({"a", "an", "the", "is", "are", "was", "were", "be", "do",
                              "does", "did", "has", "have", "had", "much", "far", "even"})
# Where the words a relation word relates end: function words. Not all stopwords:
# "list", "number" or "way" are one side in "convert a list into a dict".
_RELATION_BOUNDS = """
and or but if of in on at by for with from onto about as then so between per
i me my mine we us our you your yours he she it its they them their
this that these those there here who whom whose which what whats when where why how wheres
can could would should will shall may might must
i'm i'd i've it's what's where's that's there's let's
"""
RELATION_BOUNDS = frozenset(_RELATION_BOUNDS.split())


def _axes(table: dict[str, tuple[str, ...]]) -> dict[str, tuple[tuple[str, int], ...]]:
    out: dict[str, list[tuple[str, int]]] = {}
    for key, words in table.items():
        axis, sign = key[:-1], 1 if key[-1] == "+" else -1
        for w in words:
            out.setdefault(w, []).append((axis, sign))
    return {w: tuple(v) for w, v in out.items()}


POLARITY = _axes(_POLARITY)
COMPARATIVE = _axes(_COMPARATIVE)

# Numbers written as words. "one" and "first" are left out: mostly pronoun ("which
# one") and adverb ("invest first"); a differing count still shows on the other side.
UNITS_WORDS = {
    "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13,
    "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17, "eighteen": 18,
    "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90, "once": 1, "twice": 2, "thrice": 3,
    "half": 0.5, "quarter": 0.25, "double": 2, "triple": 3, "single": 1,
}
MULTIPLIERS = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9,
               "dozen": 12, "k": 1000}
ORDINALS = {
    "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7,
    "eighth": 8, "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12,
}

# Dates and times: each token's canonical name.
MONTHS = {m: m for m in ("january", "february", "april", "june", "july", "august",
                         "september", "october", "november", "december")}
MONTHS |= {"jan": "january", "feb": "february", "apr": "april", "jun": "june",
           "jul": "july", "aug": "august", "sep": "september", "sept": "september",
           "oct": "october", "nov": "november", "dec": "december"}
AMBIGUOUS_MONTHS = {"may": "may", "march": "march"}  # months only next to "in"/a number
WEEKDAYS = {d: d for d in ("monday", "tuesday", "wednesday", "thursday", "friday",
                           "saturday", "sunday")}
WEEKDAYS |= {d + "s": d for d in WEEKDAYS}
DATE_WORDS = {
    "today": "today", "tonight": "tonight", "tomorrow": "tomorrow",
    "yesterday": "yesterday", "weekend": "weekend", "weekends": "weekend",
    "weekday": "weekday", "weekdays": "weekday", "spring": "spring", "summer": "summer",
    "autumn": "autumn", "winter": "winter", "christmas": "christmas", "easter": "easter",
    "thanksgiving": "thanksgiving", "halloween": "halloween", "morning": "morning",
    "afternoon": "afternoon", "evening": "evening", "night": "night", "noon": "noon",
    "midnight": "midnight", "overnight": "night",
}
# "next week", "last month", "this friday": the modifier counts only before these.
RELATIVE = frozenset({"next", "last", "this", "past", "coming", "previous"})
RELATIVE_UNITS = frozenset({"week", "month", "year", "weekend", "night", "morning",
                            "evening", "summer", "winter", "spring", "autumn", "fall",
                            "quarter", "decade", "season"} | set(WEEKDAYS))

# Units: canonical name per spelling. AMBIGUOUS ones count only right after a number.
UNITS = {
    "km": "km", "kilometer": "km", "kilometers": "km", "kilometre": "km", "kilometres": "km",
    "mile": "mile", "miles": "mile", "meter": "m", "meters": "m", "metre": "m",
    "metres": "m", "cm": "cm", "centimeter": "cm", "centimeters": "cm", "mm": "mm",
    "millimeter": "mm", "millimeters": "mm", "ft": "ft", "foot": "ft", "feet": "ft",
    "inch": "inch", "inches": "inch", "yard": "yard", "yards": "yard", "yd": "yard",
    "kg": "kg", "kgs": "kg", "kilogram": "kg", "kilograms": "kg", "kilo": "kg",
    "kilos": "kg", "gram": "g", "grams": "g", "mg": "mg", "milligram": "mg",
    "milligrams": "mg", "lb": "lb", "lbs": "lb", "pound": "lb", "pounds": "lb",
    "oz": "oz", "ounce": "oz", "ounces": "oz", "ton": "t", "tons": "t", "tonne": "t",
    "tonnes": "t", "stone": "stone", "celsius": "degC", "centigrade": "degC",
    "fahrenheit": "degF", "kelvin": "K", "liter": "l", "liters": "l", "litre": "l",
    "litres": "l", "ml": "ml", "milliliter": "ml", "milliliters": "ml",
    "millilitre": "ml", "millilitres": "ml", "gallon": "gal", "gallons": "gal",
    "gal": "gal", "cup": "cup", "cups": "cup", "teaspoon": "tsp", "teaspoons": "tsp",
    "tsp": "tsp", "tablespoon": "tbsp", "tablespoons": "tbsp", "tbsp": "tbsp",
    "pint": "pint", "pints": "pint", "quart": "quart", "quarts": "quart",
    "$": "usd", "usd": "usd", "dollar": "usd", "dollars": "usd", "bucks": "usd",
    "€": "eur", "eur": "eur", "euro": "eur", "euros": "eur", "£": "gbp", "gbp": "gbp",
    "sterling": "gbp", "¥": "jpy", "jpy": "jpy", "yen": "jpy", "yuan": "cny",
    "cny": "cny", "rmb": "cny", "inr": "inr", "rupee": "inr", "rupees": "inr",
    "cad": "cad", "aud": "aud", "chf": "chf", "franc": "chf", "francs": "chf",
    "kb": "kb", "mb": "mb", "gb": "gb", "tb": "tb", "kilobyte": "kb", "kilobytes": "kb",
    "megabyte": "mb", "megabytes": "mb", "gigabyte": "gb", "gigabytes": "gb",
    "terabyte": "tb", "terabytes": "tb", "kbps": "kbps", "mbps": "mbps", "gbps": "gbps",
    "ghz": "ghz", "mhz": "mhz", "mph": "mph", "kph": "kmh", "kmh": "kmh", "mpg": "mpg",
    "%": "pct", "percent": "pct", "percentage": "pct", "calorie": "kcal",
    "calories": "kcal", "kcal": "kcal", "kj": "kj", "watt": "w", "watts": "w",
    "kwh": "kwh", "volt": "v", "volts": "v",
}
AMBIGUOUS_UNITS = {
    "m": "m", "g": "g", "l": "l", "c": "degC", "f": "degF", "h": "hour", "hr": "hour",
    "hrs": "hour", "s": "second", "sec": "second", "secs": "second", "min": "minute",
    "mins": "minute", "k": "thousand", "in": "inch", "w": "w", "v": "v",
    "second": "second", "seconds": "second", "minute": "minute", "minutes": "minute",
    "hour": "hour", "hours": "hour", "day": "day", "days": "day", "week": "week",
    "weeks": "week", "month": "month", "months": "month", "year": "year",
    "years": "year", "decade": "decade", "decades": "decade", "night": "night",
    "nights": "night",
}
RATES = {"daily": "day", "weekly": "week", "monthly": "month", "yearly": "year",
         "annually": "year", "annual": "year", "hourly": "hour", "nightly": "night"}
RATE_MARKERS = frozenset({"a", "an", "per", "each", "every"})
UNIT_FILLERS = frozenset({"degree", "degrees", "square", "sq", "cubic", "fluid", "fl",
                          "-"})

# Constraint words: canonical name per spelling (phrases are matched first).
CONSTRAINTS = {
    "only": "only", "solely": "only", "exclusively": "only",
    "except": "except", "excluding": "except", "exclude": "except", "excludes": "except",
    "but not": "except", "other than": "except", "apart from": "except",
    "including": "include", "include": "include", "includes": "include",
    "at least": "at_least", "minimum": "at_least", "or more": "at_least",
    "at most": "at_most", "maximum": "at_most", "up to": "at_most", "or less": "at_most",
    "no more than": "at_most", "exactly": "exactly", "precisely": "exactly",
    "without": "without", "no": "without", "with no": "without", "free": "without",
}

# Words that frame a question rather than say what it is about: left out of the
# content words that the scope guard compares.
_STOPWORDS = """
a an the and or but if of to in on at by for with from into onto about as than then
so very too also just really please kindly quick quickly briefly simply
i me my mine we us our you your yours he she it its they them their this that these
those there here who whom whose which what whats when where why how wheres
is are was were be been being am do does did done doing have has had having
can could would should will shall may might must need needs want wants wanted like
i'm i'd i've it's what's where's that's there's let let's
tell give explain describe define summarize list find help know get got
way ways best steps step method methods tips tip process procedure guide
possible okay ok fine allowed able
some any all every each one ones thing things something anything
usually typically typical generally normally common commonly
many much number amount between vs versus work works available offer offers provide
again still already yet now right currently
"""
STOPWORDS = frozenset(_STOPWORDS.split())

# Spellings and synonyms folded before content words are compared.
SYNONYMS = {
    "cost": "price", "costs": "price", "prices": "price", "pricing": "price",
    "update": "change", "modify": "change", "edit": "change", "alter": "change",
    "delete": "remove", "erase": "remove", "purchase": "buy",
    "repair": "fix", "mend": "fix", "centre": "center", "colour": "color",
    "kid": "child", "kids": "child", "children": "child", "photo": "picture",
    "photos": "picture", "film": "movie", "films": "movie", "vacation": "holiday",
    "vacations": "holiday", "holidays": "holiday", "baggage": "luggage",
    "delivery": "shipping", "deliver": "shipping", "delivered": "shipping",
    "ship": "shipping", "shipped": "shipping", "author": "write", "wrote": "write",
    "written": "write", "writer": "write", "email": "email", "e-mail": "email",
    "mail": "email", "tallest": "highest", "influenza": "flu", "daily": "day",
    "workout": "exercise", "workouts": "exercise", "exercising": "exercise",
    "reason": "cause", "reasons": "cause", "causes": "cause", "minor": "small",
    "replacement": "substitute", "instead": "substitute", "alternative": "substitute",
    "dict": "dictionary", "int": "integer", "temp": "temperature",
    "approximately": "about", "travel": "visit", "trip": "visit",
    "keep": "prevent", "pack": "bring", "arrive": "shipping", "arrived": "shipping",
    "turn": "convert",
    # "differ" and the words made from it (the stemmer strips inflections only)
    "difference": "differ", "differences": "differ", "different": "differ",
    "differently": "differ", "differing": "differ",
}
