# ruff: noqa: E501  (one prompt pair or intent per line: the data reads best unwrapped)
"""The source of ``semantic_eval.jsonl``: hand-written paraphrase intents and trap pairs.

Run ``python bench/data/semantic_eval_source.py`` to rewrite the JSONL. The split is
decided here, before any tuning: groups (one paraphrase intent with its three phrasings,
or one trap pair) are shuffled with a fixed seed per kind and the first half of each kind
goes to "train", the rest to "test", so no intent has pairs in both splits.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

SEED = 20261130

# One intent per line: three phrasings that one answer serves (rewording, reordering,
# politeness, lowercase/terse search style, digits vs number words, abbreviations).
PARAPHRASES = """
How do I reset my password? | What's the way to reset my password? | i forgot my password, how can i reset it
How can I change the email address on my account? | I want to update my account's email address, how? | Steps to change the email on my account
Where can I download my invoice? | How do I get a copy of my invoice? | where do i find my invoices to download
How do I cancel my subscription? | I'd like to cancel my subscription, how do I do that? | cancel subscription - how?
Why was my card declined? | My card got declined, why? | What are the reasons my card was declined?
How long does shipping take? | How many days does delivery usually take? | What is the typical shipping time?
Can I return an item after 30 days? | Is it possible to return an item after 30 days? | are returns allowed after thirty days?
How do I contact customer support? | What's the best way to reach customer service? | how can i get in touch with support
How do I enable two-factor authentication? | How can I turn on two-factor authentication? | steps to switch on two factor authentication for my account
Can I change my delivery address after ordering? | Is it possible to update the shipping address after I placed the order? | change delivery address after placing an order?
How do I delete my account? | I want to permanently remove my account, how? | what are the steps to delete my account
Where is my order? | How can I track my order? | where's my order right now, how do i track it
Do you offer student discounts? | Is there a discount for students? | are student discounts available
How do I update my payment method? | How can I change the payment method on file? | update payment method how
What are your opening hours? | When are you open? | what time do you open and close
What is the capital of Australia? | Which city is Australia's capital? | capital city of australia?
Who wrote Pride and Prejudice? | Who is the author of Pride and Prejudice? | pride and prejudice was written by whom
What causes the seasons on Earth? | Why does Earth have seasons? | what is the reason for the seasons on earth
How does photosynthesis work? | Can you explain how photosynthesis works? | explain the process of photosynthesis
What is the speed of light? | How fast does light travel? | what's the speed of light in a vacuum?
When did World War II end? | In what year did World War II come to an end? | world war ii ended in which year
What is the tallest mountain in the world? | Which mountain is the highest on Earth? | world's tallest mountain?
How many continents are there? | What is the number of continents? | how many continents does the world have
Summarize the plot of Hamlet | Give me a summary of Hamlet's plot | what happens in Hamlet, briefly
How do I reverse a list in Python? | What's the way to reverse a Python list? | python: reverse a list
How do I read a file line by line in Python? | Read a file line-by-line in python | What is the best way to iterate over the lines of a file in Python?
What is the difference between a list and a tuple in Python? | How do Python lists differ from tuples? | python list vs tuple difference
How do I undo the last git commit? | How can I roll back my most recent git commit? | git: undo last commit
How do I center a div in CSS? | What's the way to center a div with CSS? | centering a div using css
How do I sort a dictionary by value in Python? | Sort a Python dict by its values | what's the way to order a dictionary by value in python
What does the JavaScript map function do? | Explain JavaScript's map function | how does map work in javascript
How do I install numpy? | What's the command to install numpy? | installing numpy, how?
How do I check which version of Node is installed? | How can I see my installed Node version? | check node version installed
How do I convert a string to an integer in Java? | Convert a String to an int in Java | java: how to turn a string into an integer
What is a race condition? | Can you explain what a race condition is? | define race condition
How long should I boil an egg for a soft yolk? | How many minutes should I boil an egg so the yolk stays soft? | soft boiled egg with a runny yolk, how long to boil?
How do I make pancakes from scratch? | What's a recipe for homemade pancakes? | pancakes from scratch recipe
Can I freeze cooked rice? | Is it okay to freeze cooked rice? | is freezing cooked rice safe
What can I use instead of eggs in baking? | What is a good egg substitute for baking? | egg replacement for baking?
How do I keep avocados from turning brown? | How can I stop an avocado from browning? | prevent avocado browning
What temperature should I bake chicken breast at? | At what oven temperature do I bake chicken breasts? | oven temp for baking chicken breast
How do I make cold brew coffee? | What's the method for making cold brew coffee at home? | cold brew coffee, how to make it
How do I sharpen a kitchen knife? | What's the best way to sharpen a kitchen knife? | sharpening a kitchen knife
As a US citizen, do I need a visa to visit Japan? | Do US citizens need a visa to travel to Japan? | visa requirements for US citizens visiting japan
What is the best time of year to visit Iceland? | When is the best season to travel to Iceland? | best time to go to iceland
How much luggage can I bring as carry-on? | What's the carry-on luggage allowance? | carry on luggage allowance?
How do I get from the airport to the city center in Paris? | What's the best way to get from the Paris airport to the city centre? | paris airport to city center transport
Can I bring liquids in my hand luggage? | Are liquids allowed in hand luggage? | liquids in hand luggage allowed?
What should I pack for a beach holiday? | What do I need to bring on a beach vacation? | packing list for a beach holiday
How early should I arrive at the airport for an international flight? | How much time before an international flight should I get to the airport? | when to arrive at the airport for international flights
What is compound interest? | Can you explain compound interest? | compound interest explained
How do I open a Roth IRA? | What are the steps to open a Roth IRA? | opening a roth ira how
What is the difference between a stock and a bond? | How do stocks differ from bonds? | stocks vs bonds difference
How can I improve my credit score? | What are ways to raise my credit score? | tips to increase my credit score
What is an index fund? | Explain what an index fund is | what are index funds
How does inflation affect savings? | What impact does inflation have on my savings? | inflation's effect on savings
Should I pay off debt or invest first? | Is it better to invest or pay off debt first? | pay off debt before investing or invest first?
What are the symptoms of the flu? | What symptoms does influenza cause? | flu symptoms?
How much water should I drink a day? | How much water should a person drink daily? | daily recommended water intake
How can I fall asleep faster? | What helps you fall asleep more quickly? | tips to fall asleep quicker
Is it safe to exercise with a cold? | Can I work out when I have a cold? | exercising while having a cold, safe?
What foods are high in iron? | Which foods contain a lot of iron? | iron-rich foods
How do I treat a minor burn? | What's the first aid for a small burn? | treating a minor burn at home
What are the benefits of stretching? | Why is stretching good for you? | benefits of stretching
Is the Kindle Paperwhite waterproof? | Is the Kindle Paperwhite water resistant? | kindle paperwhite waterproof?
How long does the battery last on the AirPods Pro? | What is the AirPods Pro battery life? | airpods pro battery life
Does the Instant Pot work as a slow cooker? | Can I use an Instant Pot as a slow cooker? | instant pot slow cooker function
How do I pair my Bose headphones with my phone? | How can I connect Bose headphones to my phone? | pairing bose headphones with a phone
What is the warranty on the Dyson V15? | How long is the Dyson V15 warranty? | dyson v15 warranty period
Is the Nintendo Switch compatible with Bluetooth headphones? | Can I use Bluetooth headphones with a Nintendo Switch? | nintendo switch bluetooth headphones support
How do I factory reset my Roku? | What's the way to reset a Roku to factory settings? | roku factory reset steps
Does this laptop come with a charger? | Is a charger included with this laptop? | laptop charger included?
How many calories are in 2 eggs? | What's the calorie count of two eggs? | calories in two eggs
Convert 5 kilometers to miles | How many miles is 5 km? | 5 km in miles
What is 15% of 80? | Calculate 15 percent of 80 | 15 percent of 80 is what?
How long do I roast a 12 pound turkey? | What's the roasting time for a 12 lb turkey? | 12-pound turkey roasting time
What is the typical weather in Rome in July? | What's the weather usually like in Rome in July? | rome weather in july
What happened on July 20, 1969? | What event took place on 20 July 1969? | july 20 1969 what happened
Is it okay to take ibuprofen on an empty stomach? | Can I take ibuprofen without eating first? | ibuprofen on an empty stomach, ok?
Why won't my laptop turn on? | My laptop doesn't turn on, why? | laptop will not power on
What should I do if my package never arrived? | My package didn't arrive, what should I do? | package not delivered, what to do
How do I stop my cat from scratching furniture? | How can I keep my cat from scratching the furniture? | prevent cat scratching furniture
"""

# Pairs whose answers differ, by what differs.
TRAPS = {
    "negation": """
How do I enable dark mode? | How do I disable dark mode?
How do I turn on notifications? | How do I turn off notifications?
Why is my phone charging so slowly? | Why is my phone not charging?
Which foods should I eat during pregnancy? | Which foods should I avoid during pregnancy?
How do I increase the font size? | How do I decrease the font size?
Is now a good time to buy a house? | Is now a good time to sell a house?
What are the advantages of remote work? | What are the disadvantages of remote work?
How do I lock my screen? | How do I unlock my screen?
How do I subscribe to the newsletter? | How do I unsubscribe from the newsletter?
What happens if I pay my credit card bill on time? | What happens if I don't pay my credit card bill on time?
What are the pros of index funds? | What are the cons of index funds?
How do I allow pop-ups in Chrome? | How do I block pop-ups in Chrome?
How do I connect to the VPN? | How do I disconnect from the VPN?
Which programming languages are statically typed? | Which programming languages are not statically typed?
How do I install the app? | How do I uninstall the app?
How can I gain weight in a healthy way? | How can I lose weight in a healthy way?
How do I encrypt a file? | How do I decrypt a file?
How do I add a user to the group? | How do I remove a user from the group?
What food can I bring on a plane? | What food can't I bring on a plane?
Which vegetables grow well in shade? | Which vegetables don't grow well in shade?
How do I show hidden files on a Mac? | How do I hide files on a Mac?
How do I zoom in on Google Maps? | How do I zoom out on Google Maps?
How do I follow someone on Instagram? | How do I unfollow someone on Instagram?
Is coffee good for your heart? | Is coffee bad for your heart?
How do I accept a meeting invite in Outlook? | How do I decline a meeting invite in Outlook?
How do I import my contacts? | How do I export my contacts?
How do I mute a conversation? | How do I unmute a conversation?
How do I upload a file to the shared drive? | How do I download a file from the shared drive?
Is it safe to eat raw cookie dough? | Why is it never safe to eat raw cookie dough?
""",
    "number": """
How many calories are in 2 eggs? | How many calories are in 3 eggs?
What is 15% of 80? | What is 20% of 80?
What happens if I boil an egg for 6 minutes? | What happens if I boil an egg for 12 minutes?
Give me a pancake recipe for 4 people | Give me a pancake recipe for 12 people
What's a good gift for a 5 year old? | What's a good gift for a 15 year old?
Is 120/80 a normal blood pressure? | Is 150/95 a normal blood pressure?
How much flour do I need for a dozen cookies? | How much flour do I need for two dozen cookies?
Can I take two ibuprofen at once? | Can I take four ibuprofen at once?
What is the square root of 144? | What is the square root of 169?
How do I split a $90 bill three ways? | How do I split a $90 bill four ways?
What's the monthly payment on a $200,000 mortgage? | What's the monthly payment on a $300,000 mortgage?
Is a credit score of 650 good? | Is a credit score of 750 good?
How many hours of sleep does a 10 year old need? | How many hours of sleep does a 40 year old need?
What are the top 5 places to visit in Italy? | What are the top 10 places to visit in Italy?
Write a 100 word summary of the French Revolution | Write a 500 word summary of the French Revolution
How many steps is 1 mile? | How many steps is 3 miles?
What does HTTP status 404 mean? | What does HTTP status 403 mean?
Explain the first amendment | Explain the second amendment
What's the best laptop under $500? | What's the best laptop under $1000?
Is running once a week enough to stay fit? | Is running twice a week enough to stay fit?
How much rice should I cook for one person? | How much rice should I cook for six people?
What time is it in UTC+2 when it is noon in UTC? | What time is it in UTC+5 when it is noon in UTC?
How long does it take to drive 100 miles? | How long does it take to drive 300 miles?
What is the interest on $10,000 at 5% for 3 years? | What is the interest on $10,000 at 5% for 10 years?
What is 7 times 8? | What is 7 times 9?
Tell me a joke | Tell me three jokes
How many players are on a team in 5-a-side football? | How many players are on a team in 7-a-side football?
Is a 3 bedroom house enough for a family of five? | Is a 2 bedroom house enough for a family of five?
""",
    "date": """
What's the weather forecast for tomorrow? | What's the weather forecast for today?
What's the weather in Paris this weekend? | What's the weather in Paris next weekend?
Is the store open on Sunday? | Is the store open on Monday?
What happened in 1989? | What happened in 1991?
Who won the World Cup in 2014? | Who won the World Cup in 2018?
What events are on in London in December? | What events are on in London in June?
What are the best things to do in Tokyo in spring? | What are the best things to do in Tokyo in autumn?
Is the pharmacy open on Christmas Day? | Is the pharmacy open on New Year's Day?
What are the public holidays in Germany in 2025? | What are the public holidays in Germany in 2026?
What's the deadline for filing taxes in 2024? | What's the deadline for filing taxes in 2025?
Show me flights to Rome next Friday | Show me flights to Rome this Friday
What did the stock market do yesterday? | What did the stock market do today?
How cold is Chicago in January? | How cold is Chicago in March?
What was the euro exchange rate last week? | What was the euro exchange rate last month?
Schedule a meeting for Tuesday morning | Schedule a meeting for Thursday morning
When is the next train after 5 pm? | When is the next train after 7 pm?
Is the museum open at 9am? | Is the museum open at 6pm?
What's on TV tonight? | What's on TV tomorrow night?
Who was president of the United States in 1995? | Who was president of the United States in 2005?
What are the store hours on weekdays? | What are the store hours on weekends?
How were our sales in Q1? | How were our sales in Q3?
Plan a trip to Spain in August | Plan a trip to Spain in November
Remind me about the dentist appointment tomorrow | Remind me about the dentist appointment next week
What fruits are in season in July? | What fruits are in season in January?
Is the library open during the summer holidays? | Is the library open during the winter holidays?
How old is someone born in 1990? | How old is someone born in 2000?
What movies came out last year? | What movies came out this year?
Where can I watch the match on Saturday? | Where can I watch the match on Sunday?
""",
    "unit": """
Convert 5 kilometers to miles | Convert 5 miles to kilometers
What is 100 degrees Fahrenheit in Celsius? | What is 100 degrees Celsius in Fahrenheit?
How many grams are in an ounce? | How many grams are in a pound?
How long do I cook chicken at 180 °C? | How long do I cook chicken at 180 °F?
How much is 50 dollars in euros? | How much is 50 pounds in euros?
Is 70 kg a healthy weight for an adult? | Is 70 lb a healthy weight for an adult?
How many cups are in a liter? | How many cups are in a gallon?
What does 1 GB of cloud storage cost? | What does 1 TB of cloud storage cost?
How long does it take to walk 5 km? | How long does it take to walk 5 miles?
Convert 3 feet to meters | Convert 3 yards to meters
What's 20 USD in JPY? | What's 20 EUR in JPY?
How many teaspoons are in a tablespoon? | How many teaspoons are in a cup?
What's the boiling point of water in Celsius? | What's the boiling point of water in Fahrenheit?
How long to download 10 GB at 100 Mbps? | How long to download 10 GB at 100 MB/s?
How much does 1 liter of milk cost? | How much does 1 gallon of milk cost?
Is a birth weight of 8 pounds normal? | Is a birth weight of 8 kilograms normal?
What is 60 km/h in mph? | What is 60 mph in km/h?
How many milliliters are in a fluid ounce? | How many milliliters are in a pint?
Can I afford an apartment for 1,000 dollars a month? | Can I afford an apartment for 1,000 dollars a week?
What's the paracetamol dose in mg per kg? | What's the paracetamol dose in mg per lb?
What does flooring cost per square foot? | What does flooring cost per square meter?
Is it safe to leave cooked rice out for 2 hours? | Is it safe to leave cooked rice out for 2 days?
What is 6 feet in centimeters? | What is 6 inches in centimeters?
How much does it cost to ship a 5 kg package to Canada? | How much does it cost to ship a 5 lb package to Canada?
Convert 30 mpg to liters per 100 km | Convert 30 km per liter to liters per 100 km
How many seconds are in 3 hours? | How many seconds are in 3 days?
Is 500 mg of vitamin C a day too much? | Is 500 g of vitamin C a day too much?
How much is 100 euros in pounds? | How much is 100 euros in yen?
""",
    "entity": """
How do I install Python 3.12 on Ubuntu? | How do I install Python 3.11 on Ubuntu?
How do I cancel my Netflix subscription? | How do I cancel my Spotify subscription?
Is the iPhone 15 Pro waterproof? | Is the iPhone 13 Pro waterproof?
Do I need a visa to visit Japan? | Do I need a visa to visit South Korea?
What is the capital of Austria? | What is the capital of Australia?
How do I factory reset my Roku? | How do I factory reset my Fire TV?
What is the best time of year to visit Iceland? | What is the best time of year to visit Norway?
How do I sort a list in Python? | How do I sort a list in JavaScript?
How do I use useEffect in React? | How do I use useState in React?
Who wrote Pride and Prejudice? | Who wrote Sense and Sensibility?
What are the side effects of ibuprofen? | What are the side effects of acetaminophen?
How do I make lasagna? | How do I make moussaka?
How do I pair AirPods with a Windows PC? | How do I pair AirPods with an Android phone?
Does the Dyson V15 come with a wall mount? | Does the Dyson V8 come with a wall mount?
What is the difference between TCP and UDP? | What is the difference between TCP and QUIC?
How do I install Docker on Windows? | How do I install Docker on macOS?
What's the battery life of the Galaxy S23? | What's the battery life of the Galaxy S24?
How do I convert a string to an int in Java? | How do I convert a string to an int in Go?
What's the flight time from London to New York? | What's the flight time from London to Boston?
Is Costco open on Sunday? | Is Walmart open on Sunday?
How do I open a Roth IRA? | How do I open a traditional IRA?
What are the symptoms of Lyme disease? | What are the symptoms of Crohn's disease?
How do I migrate from MySQL to PostgreSQL? | How do I migrate from PostgreSQL to MySQL?
What does git rebase do? | What does git merge do?
How do I get from CDG airport to central Paris? | How do I get from Orly airport to central Paris?
Give me a recipe for chicken tikka masala | Give me a recipe for paneer tikka masala
Is the Kindle Paperwhite waterproof? | Is the Kindle Oasis waterproof?
Who is the CEO of Microsoft? | Who is the CEO of Apple?
""",
    "comparative": """
What is the cheapest way to get to the airport? | What is the fastest way to get to the airport?
Is Python faster than Java? | Is Python slower than Java?
What's the most expensive item on the menu? | What's the cheapest item on the menu?
Which planet is the largest? | Which planet is the smallest?
Should I take this medicine before meals? | Should I take this medicine after meals?
Which foods have more protein than eggs? | Which foods have less protein than eggs?
Show me hotels in Lisbon above $200 a night | Show me hotels in Lisbon below $200 a night
What's the best laptop for students? | What's the worst laptop for students?
Which is the longest river in Europe? | Which is the shortest river in Europe?
Which country has the highest life expectancy? | Which country has the lowest life expectancy?
Which stocks went up the most today? | Which stocks went down the most today?
Should I water my plants more often in winter? | Should I water my plants less often in winter?
What is the earliest flight to Berlin tomorrow? | What is the latest flight to Berlin tomorrow?
What is the warmest place in Europe in winter? | What is the coldest place in Europe in winter?
Which phones have bigger screens than the iPhone 15? | Which phones have smaller screens than the iPhone 15?
What should I do before a job interview? | What should I do after a job interview?
Is a Tesla Model 3 heavier than a Toyota Camry? | Is a Tesla Model 3 lighter than a Toyota Camry?
What is the most popular programming language? | What is the least popular programming language?
What is the newest version of Android? | What is the oldest supported version of Android?
What is the fastest sorting algorithm? | What is the slowest sorting algorithm?
What's the strongest painkiller I can buy without a prescription? | What's the mildest painkiller I can buy without a prescription?
Why are mortgage rates higher this year? | Why are mortgage rates lower this year?
Which savings accounts pay the most interest? | Which savings accounts pay the least interest?
Should I stretch before running? | Should I stretch after running?
What is the minimum age to rent a car? | What is the maximum age to rent a car?
What is the biggest city in Canada? | What is the smallest city in Canada?
Why is my computer running slower than usual? | Why is my computer running faster than usual?
Is it warmer in Madrid or Barcelona in May? | Is it colder in Madrid or Barcelona in May?
""",
    "constraint": """
Give me vegetarian recipes without eggs | Give me vegetarian recipes with eggs
Find flights to Tokyo with only carry-on luggage | Find flights to Tokyo including checked luggage
List the European countries in the EU | List the European countries except EU members
Show hotels in Rome with at least 4 stars | Show hotels in Rome with at most 4 stars
Which phones under $500 include 5G? | Which phones under $500 have no 5G?
Give me recipes that use only chicken and rice | Give me recipes that use chicken and rice
Show all orders including cancelled ones | Show all orders excluding cancelled ones
Give me a pasta recipe | Give me a gluten-free pasta recipe
Find trains from Berlin to Munich with no changes | Find trains from Berlin to Munich with at most one change
Which cars have at least 7 seats? | Which cars have exactly 7 seats?
Which laptops have only USB-C ports? | Which laptops have USB-C ports?
Find vacation rentals that allow pets | Find vacation rentals that don't allow pets
Suggest some desserts | Suggest some sugar-free desserts
What workouts can I do at home without equipment? | What workouts can I do at home with dumbbells?
Which countries can I visit visa-free with a UK passport? | Which countries require a visa for a UK passport?
Suggest salads that include nuts | Suggest salads that exclude nuts
Find hotels near the beach | Find only hotels right on the beach
Recommend a breakfast cereal with no added sugar | Recommend a breakfast cereal
Write a SQL query to select all users except admins | Write a SQL query to select all users
Which museums in Paris are free on Sundays? | Which museums in Paris are open on Sundays?
Which restaurants stay open late only on weekends? | Which restaurants stay open late?
Suggest exercises for back pain, excluding running | Suggest exercises for back pain
Which ice cream brands are dairy-free? | Which ice cream brands are there?
Recommend wireless headphones with noise cancelling | Recommend wireless headphones without noise cancelling
Which stocks pay dividends? | Which stocks pay no dividends?
Which jobs can I get with at least a bachelor's degree? | Which jobs can I get without a degree?
Summarize this article | Summarize this article in at most two sentences
Which fruits can dogs eat? | Which fruits, except grapes, can dogs eat?
""",
    "scope": """
How do I reset my password on the mobile app? | How do I reset my password on the website?
What is the return policy for electronics? | What is the return policy for clothing?
How long should I boil an egg? | How long should I boil potatoes?
What are the side effects of the flu vaccine for children? | What are the side effects of the flu vaccine for adults?
How much should a puppy eat? | How much should a kitten eat?
How do I change the oil in my car? | How do I change the oil in my motorcycle?
What are the best exercises for beginners? | What are the best exercises for advanced athletes?
How much tax do I pay on savings interest? | How much tax do I pay on dividends?
How do I clean a cast iron pan? | How do I clean a nonstick pan?
Explain recursion to a child | Explain recursion to a software engineer
Write a cover letter for a nursing job | Write a cover letter for a teaching job
How do I care for a succulent? | How do I care for a fern?
What is the dosage of amoxicillin for a child? | What is the dosage of amoxicillin for an adult?
How do I make my account private? | How do I make a single post private?
How do I delete a message? | How do I delete a channel?
What is the tax filing deadline for businesses? | What is the tax filing deadline for individuals?
How much is shipping for international orders? | How much is shipping for domestic orders?
How do I back up my photos? | How do I back up my contacts?
What are some healthy breakfast ideas for kids? | What are some healthy breakfast ideas for diabetics?
How do I remove a red wine stain from a carpet? | How do I remove a red wine stain from a shirt?
What interview questions are asked for a junior developer role? | What interview questions are asked for a senior developer role?
How do I sort rows in a spreadsheet? | How do I sort columns in a spreadsheet?
How much sleep does a newborn need? | How much sleep does a teenager need?
How do I freeze bread? | How do I freeze cheese?
What should I feed a rabbit? | What should I feed a hamster?
How do I fix a leaking faucet? | How do I fix a leaking toilet?
How do I change my profile picture? | How do I change my username?
How do I write a resignation letter? | How do I write a reference letter?
""",
    # The same words and numbers with two of them swapped around a comparison or
    # relation ("than", "vs", "beat", "to", "before"). Named "word-order" so that it sorts
    # after the other kinds: `rows` shuffles kinds in name order with one generator,
    # and the kinds above keep the splits they had before it was added.
    "word-order": """
Is Rust faster than Go? | Is Go faster than Rust?
Is 5 bigger than 3? | Is 3 bigger than 5?
Is Python 3.12 faster than 3.11? | Is Python 3.11 faster than 3.12?
Did Germany beat Brazil in 2014? | Did Brazil beat Germany in 2014?
What are the advantages of PostgreSQL vs MySQL? | What are the advantages of MySQL vs PostgreSQL?
Where is the Arsenal vs Chelsea match played? | Where is the Chelsea vs Arsenal match played?
How do I convert Celsius to Fahrenheit? | How do I convert Fahrenheit to Celsius?
How do I convert a string to an integer in Python? | How do I convert an integer to a string in Python?
Is 17 larger than 71? | Is 71 larger than 17?
Is 0.5 greater than 0.25? | Is 0.25 greater than 0.5?
Is 5 July 2025 later than 7 May 2025? | Is 7 May 2025 later than 5 July 2025?
Move my Monday meeting to Friday | Move my Friday meeting to Monday
Does Messi have more goals than Ronaldo? | Does Ronaldo have more goals than Messi?
Is Mount Everest taller than K2? | Is K2 taller than Mount Everest?
Is an iPhone more expensive than a Pixel? | Is a Pixel more expensive than an iPhone?
Is Tokyo bigger than New York? | Is New York bigger than Tokyo?
Did the Lakers beat the Celtics in the 2008 finals? | Did the Celtics beat the Lakers in the 2008 finals?
How many times did Federer beat Nadal? | How many times did Nadal beat Federer?
Why is Chrome slower than Firefox? | Why is Firefox slower than Chrome?
Is 1 kg heavier than 2 pounds? | Is 2 pounds heavier than 1 kg?
How do I translate English into German? | How do I translate German into English?
What is the USD to EUR exchange rate? | What is the EUR to USD exchange rate?
Did Brazil lose to Germany in 2014? | Did Germany lose to Brazil in 2014?
Book the hotel for June 3 and the flight for June 10 | Book the hotel for June 10 and the flight for June 3
Was Obama president before Trump? | Was Trump president before Obama?
Did Google buy YouTube? | Did YouTube buy Google?
Does Microsoft own GitHub? | Does GitHub own Microsoft?
Did Facebook acquire Instagram? | Did Instagram acquire Facebook?
Did Amazon sue Apple over patents? | Did Apple sue Amazon over patents?
Is Spotify owned by Sony? | Is Sony owned by Spotify?
Does Netflix pay Comcast for bandwidth? | Does Comcast pay Netflix for bandwidth?
Did Einstein influence Bohr? | Did Bohr influence Einstein?
Is Pluto a moon of Neptune? | Is Neptune a moon of Pluto?
Did Caesar defeat Pompey? | Did Pompey defeat Caesar?
Is Lisbon west of Madrid? | Is Madrid west of Lisbon?
Can Alice read Bob's messages? | Can Bob read Alice's messages?
Why did Nokia sell its phones business to Microsoft? | Why did Microsoft sell its phones business to Nokia?
""",
}


def _lines(block: str) -> list[list[str]]:
    return [[p.strip() for p in line.split("|")] for line in block.strip().splitlines()]


def groups() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """``(kind, label, pairs)`` per group: one intent's three pairs, or one trap pair."""
    out = [("paraphrase", "hit", list(itertools.combinations(p, 2)))
           for p in _lines(PARAPHRASES)]
    out += [(kind, "trap", [(a, b)]) for kind, block in TRAPS.items() for a, b in _lines(block)]
    return out


def rows() -> list[dict[str, str]]:
    """Every pair with its split: per kind, the groups shuffled with `SEED`, the
    first half (rounded up) "train"."""
    rng = random.Random(SEED)
    by_kind: dict[str, list[tuple[str, list[tuple[str, str]]]]] = {}
    for kind, label, pairs in groups():
        by_kind.setdefault(kind, []).append((label, pairs))
    out = []
    for kind in sorted(by_kind):
        gs = by_kind[kind]
        rng.shuffle(gs)
        half = (len(gs) + 1) // 2
        for i, (label, pairs) in enumerate(gs):
            split = "train" if i < half else "test"
            out += [{"a": a, "b": b, "label": label, "kind": kind, "split": split,
                     "group": f"{kind}-{i}"} for a, b in pairs]
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("semantic_eval.jsonl")
    with path.open("w") as f:
        for row in rows():
            f.write(json.dumps(row) + "\n")
    print(f"wrote {path}")
